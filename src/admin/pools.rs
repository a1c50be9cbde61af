//! `/admin/upstreams`, and the console's pools: every pool's targets as
//! JSON.

use crate::pipeline::Gateway;

/// Every pool with each of its endpoints — every address a target stands
/// for — and what they have been through.
pub fn upstreams(gw: &Gateway) -> serde_json::Value {
    let pools: Vec<serde_json::Value> = gw
        .balancers()
        .iter()
        .map(|b| {
            let eps = b.endpoints();
            let targets: Vec<serde_json::Value> = eps
                .list
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "target": &*b.config.targets[e.target].url,
                        "address": e.addr.map(|a| a.to_string()),
                        "weight": e.weight,
                        "healthy": e.state.healthy(),
                        "ejected": e.state.is_ejected(),
                        "ejections": e.state.ejections(),
                        "in_flight": e.state.in_flight(),
                    })
                })
                .collect();
            serde_json::json!({
                "name": b.name(),
                "balance": crate::config::Balance::SPELLINGS
                    .iter()
                    .find(|(_, v)| *v == b.config.balance)
                    .map(|(n, _)| *n),
                "targets": targets,
            })
        })
        .collect();
    serde_json::json!({ "pools": pools })
}
