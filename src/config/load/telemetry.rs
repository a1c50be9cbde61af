//! `tracing`: the OTLP/HTTP endpoint spans go to and the share of requests
//! traced, from the file or, for what the file leaves out, from
//! OpenTelemetry's standard variables.
//!
//! The file wins, field by field: `otlp_endpoint` over
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `sample_ratio` over
//! `OTEL_TRACES_SAMPLER_ARG` (OpenTelemetry's own rule: configuration
//! written for one program beats the environment every program reads).
//! Tracing is on when either names an endpoint. A variable set to empty
//! text counts as not set, as the OpenTelemetry specification says. A bad
//! variable is an error like a bad field, named after the variable, with no
//! line or column.

use http::Uri;

use super::check::{Check, Checked, text};
use super::environment::Env;
use crate::config::TracingConfig;
use crate::config::file::{self, Field};
use crate::config::position::child_key;

/// The variable that names the collector when the file does not.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The variable that gives the sample ratio when the file does not.
pub const RATIO_VAR: &str = "OTEL_TRACES_SAMPLER_ARG";

/// The path spans are posted to under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

impl Check<'_> {
    /// `tracing`, completed from `env`; `None` when no endpoint is named.
    pub(super) fn tracing(
        &mut self,
        section: &Field<file::Tracing>,
        env: Env<'_>,
    ) -> Checked<Option<TracingConfig>> {
        let written = self.optional(section, "tracing", |check, s, path| {
            let endpoint = check.optional(
                &s.otlp_endpoint,
                &child_key(path, "otlp_endpoint"),
                text(parse_endpoint),
            );
            let ratio = check.optional(
                &s.sample_ratio,
                &child_key(path, "sample_ratio"),
                text(parse_ratio),
            );
            Ok((endpoint?, ratio?))
        })?;
        let present = written.is_some();
        let (endpoint, ratio) = written.unwrap_or((None, None));
        let endpoint = match endpoint {
            Some(e) => Some(e),
            None => self.variable(env, ENDPOINT_VAR, "tracing.otlp_endpoint", parse_endpoint)?,
        };
        let Some(endpoint) = endpoint else {
            if present {
                let pos = self.positions.value("tracing");
                return Err(self.push(
                    "tracing",
                    format!("missing required field \"otlp_endpoint\" (or set {ENDPOINT_VAR})"),
                    pos,
                ));
            }
            return Ok(None);
        };
        let sample_ratio = match ratio {
            Some(r) => r,
            None => self
                .variable(env, RATIO_VAR, "tracing.sample_ratio", parse_ratio)?
                .unwrap_or(TracingConfig::DEFAULT_SAMPLE_RATIO),
        };
        Ok(Some(TracingConfig {
            endpoint,
            sample_ratio,
        }))
    }

    /// The variable `name` read by `parse`; `None` when it is not set or
    /// empty. An error is recorded at `path`, naming the variable.
    fn variable<T>(
        &mut self,
        env: Env<'_>,
        name: &str,
        path: &str,
        parse: fn(&str) -> Result<T, String>,
    ) -> Checked<Option<T>> {
        let Some(value) = env(name).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        parse(&value)
            .map(Some)
            .map_err(|m| self.push(path, format!("from {name}: {m}"), None))
    }
}

/// A collector's OTLP/HTTP address: its base URL, to which `/v1/traces` is
/// added as OpenTelemetry's exporters add it to
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, or the full URL when it already ends so.
fn parse_endpoint(s: &str) -> Result<Uri, String> {
    let hint = "write the collector's http:// or https:// URL, e.g. http://otel-collector:4318";
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; {hint}"))?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(format!("{s:?} is not an absolute URL; {hint}"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("{s:?} is not an http or https URL; {hint}"));
    }
    if uri.query().is_some() {
        return Err(format!("{s:?} has a query; {hint}"));
    }
    let path = uri.path().trim_end_matches('/');
    let path = if path.ends_with(TRACES_PATH) {
        path.to_owned()
    } else {
        format!("{path}{TRACES_PATH}")
    };
    format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; {hint}"))
}

/// A share from 0 to 1 (`0.01`, `1`).
fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "{s:?} is not a ratio; write a number from 0 to 1, e.g. 0.01 for one request in a hundred"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::parse_str_with_env;

    const ROUTES: &str = "routes: [ { name: r, respond: {} } ]\n";

    /// The tracing settings of `file`'s `tracing:` lines (and a route),
    /// with `vars` as the whole environment; or the errors, one per line.
    fn load(tracing: &str, vars: &[(&str, &str)]) -> Result<Option<TracingConfig>, String> {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let src = format!("listen: 127.0.0.1:0\n{tracing}{ROUTES}");
        parse_str_with_env(&src, &env)
            .map(|c| c.tracing)
            .map_err(|e| e.to_string())
    }

    fn on(endpoint: &str, sample_ratio: f64) -> Option<TracingConfig> {
        Some(TracingConfig {
            endpoint: endpoint.parse().unwrap(),
            sample_ratio,
        })
    }

    #[test]
    fn every_bad_field_is_named_with_its_line_and_column() {
        let errors = load(
            "tracing:\n  otlp_endpoint: grpc://c:4317\n  sample_ratio: 2\n  sampler: always\n",
            &[],
        )
        .unwrap_err();
        let lines: Vec<&str> = errors.lines().collect();
        assert_eq!(lines.len(), 3, "{errors}");
        assert!(
            lines[0].starts_with(
                "tracing.otlp_endpoint: \"grpc://c:4317\" is not an http or https URL"
            ) && lines[0].ends_with("(line 3, col 18)"),
            "{errors}"
        );
        assert!(
            lines[1].starts_with("tracing.sample_ratio: \"2\" is not a ratio")
                && lines[1].ends_with("(line 4, col 17)"),
            "{errors}"
        );
        assert!(
            lines[2].starts_with(
                "tracing: unknown field \"sampler\"; expected one of otlp_endpoint, sample_ratio"
            ) && lines[2].ends_with("(line 5, col 3)"),
            "{errors}"
        );
        let errors = load("tracing: { sample_ratio: 0.5 }\n", &[]).unwrap_err();
        assert!(
            errors.starts_with("tracing: missing required field \"otlp_endpoint\" (or set OTEL_EXPORTER_OTLP_ENDPOINT)"),
            "{errors}"
        );
    }

    #[test]
    fn the_file_wins_field_by_field_over_the_otel_variables() {
        assert_eq!(load("", &[]), Ok(None));
        // Empty text is not set.
        assert_eq!(load("", &[(ENDPOINT_VAR, "")]), Ok(None));
        assert_eq!(
            load("", &[(ENDPOINT_VAR, "http://env:4318")]),
            Ok(on("http://env:4318/v1/traces", 1.0))
        );
        assert_eq!(
            load(
                "",
                &[(ENDPOINT_VAR, "http://env:4318"), (RATIO_VAR, "0.25")]
            ),
            Ok(on("http://env:4318/v1/traces", 0.25))
        );
        assert_eq!(
            load(
                "tracing: { otlp_endpoint: \"http://file:4318\" }\n",
                &[(ENDPOINT_VAR, "http://env:4318"), (RATIO_VAR, "0.25")]
            ),
            Ok(on("http://file:4318/v1/traces", 0.25))
        );
        assert_eq!(
            load(
                "tracing: { sample_ratio: 0.01 }\n",
                &[(ENDPOINT_VAR, "http://env:4318"), (RATIO_VAR, "0.25")]
            ),
            Ok(on("http://env:4318/v1/traces", 0.01))
        );
        // The ratio alone does not turn tracing on.
        assert_eq!(load("", &[(RATIO_VAR, "0.25")]), Ok(None));
        // A bad variable is named; it has no line in the file.
        let errors = load("", &[(ENDPOINT_VAR, "collector:4318")]).unwrap_err();
        assert!(
            errors.starts_with(
                "tracing.otlp_endpoint: from OTEL_EXPORTER_OTLP_ENDPOINT: \"collector:4318\""
            ),
            "{errors}"
        );
        assert!(!errors.contains("line"), "{errors}");
        let errors = load("", &[(ENDPOINT_VAR, "http://c"), (RATIO_VAR, "all")]).unwrap_err();
        assert!(
            errors.starts_with(
                "tracing.sample_ratio: from OTEL_TRACES_SAMPLER_ARG: \"all\" is not a ratio"
            ),
            "{errors}"
        );
    }

    #[test]
    fn endpoints_get_the_traces_path_once() {
        let e = |s: &str| parse_endpoint(s).map(|u| u.to_string());
        assert_eq!(e("http://c:4318").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(e("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            e("https://c/otlp/v1/traces").unwrap(),
            "https://c/otlp/v1/traces"
        );
        assert_eq!(e("http://c/otlp").unwrap(), "http://c/otlp/v1/traces");
        assert!(e("c:4318").is_err());
        assert!(e("grpc://c:4317").is_err());
        assert!(e("/v1/traces").is_err());
        assert!(e("http://c/?a=b").is_err());
    }

    #[test]
    fn ratios() {
        assert_eq!(parse_ratio("0.01"), Ok(0.01));
        assert_eq!(parse_ratio("1"), Ok(1.0));
        assert_eq!(parse_ratio("0"), Ok(0.0));
        assert!(parse_ratio("1.5").is_err());
        assert!(parse_ratio("-0.1").is_err());
        assert!(parse_ratio("NaN").is_err());
        assert!(parse_ratio("half").is_err());
    }
}
