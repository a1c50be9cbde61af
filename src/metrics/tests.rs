use super::*;

/// A request that ended so, whatever its limits decided.
fn ended(ending: Ending) -> Outcome {
    Outcome {
        ending,
        access: Access::None,
    }
}

#[test]
fn routes_get_series_before_any_request() {
    let config = crate::config::load::parse_str(
        "listen: 127.0.0.1:0\nroutes:\n  - name: r\n    respond: {}\n    limits: [ { name: l, key: ip, limit: 1, window: 1s } ]\n",
    )
    .expect("valid");
    let m = Metrics::new();
    let routes = m.routes(&config);
    routes["r"].count(ended(Ending::Limited));
    routes["r"].limits[0].count(Verdict::ShadowLimited);
    routes["r"].upstream_response(http::StatusCode::BAD_GATEWAY, Duration::from_millis(3));
    routes["r"].count(ended(Ending::ClientError));
    routes["r"].client_error(ClientErrorKind::Aborted);
    m.reloaded(false);
    let text = m.render();
    for line in [
        "tollgate_requests_total{route=\"r\",outcome=\"limited\"} 1",
        "tollgate_requests_total{route=\"r\",outcome=\"allowed\"} 0",
        "tollgate_decisions_total{route=\"r\",limit=\"l\",outcome=\"shadow_limited\"} 1",
        "tollgate_upstream_responses_total{route=\"r\",class=\"5xx\"} 1",
        "tollgate_requests_total{route=\"r\",outcome=\"client_error\"} 1",
        "tollgate_client_errors_total{route=\"r\",kind=\"aborted\"} 1",
        "tollgate_client_errors_total{route=\"r\",kind=\"bad_body\"} 0",
        "tollgate_config_reloads_total{result=\"failure\"} 1",
        "tollgate_store_fallback 0",
        "tollgate_store_breaker_open 0",
        "tollgate_store_fault{kind=\"auth\"} 0",
        "tollgate_store_fault{kind=\"tls\"} 0",
        "tollgate_log_lines_dropped_total 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from\n{text}"
        );
    }
    // A second resolution (a reload) shares the series.
    let again = m.routes(&config);
    again["r"].count(ended(Ending::Limited));
    assert!(
        m.render()
            .contains("tollgate_requests_total{route=\"r\",outcome=\"limited\"} 2")
    );
}
