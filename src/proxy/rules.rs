//! Header rules (`request_headers`, `response_headers`): `remove` deletes,
//! then `set` replaces (or adds when absent), then `add` appends beside
//! any of the same name. The loader refuses names the gateway owns, so a
//! rule never undoes forwarding, identity, framing or CORS headers.

use http::HeaderMap;

use crate::config::HeaderRules;

/// Applies `rules` to `headers`.
pub fn apply(rules: &HeaderRules, headers: &mut HeaderMap) {
    for name in &rules.remove {
        headers.remove(name);
    }
    for (name, value) in &rules.set {
        headers.insert(name.clone(), value.clone());
    }
    for (name, value) in &rules.add {
        headers.append(name.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    #[test]
    fn remove_then_set_then_add() {
        let n = |s: &'static str| HeaderName::from_static(s);
        let v = |s: &'static str| HeaderValue::from_static(s);
        let rules = HeaderRules {
            set: vec![(n("x-gateway"), v("tollgate"))],
            add: vec![(n("via"), v("1.1 tollgate"))],
            remove: vec![n("server"), n("x-gateway")],
        };
        let mut h = HeaderMap::new();
        h.insert("server", v("upstream/1.0"));
        h.append("x-gateway", v("a"));
        h.append("x-gateway", v("b"));
        h.insert("via", v("1.1 cdn"));
        apply(&rules, &mut h);
        assert!(!h.contains_key("server"));
        assert_eq!(
            h.get_all("x-gateway").iter().collect::<Vec<_>>(),
            ["tollgate"]
        );
        assert_eq!(
            h.get_all("via").iter().collect::<Vec<_>>(),
            ["1.1 cdn", "1.1 tollgate"]
        );
    }
}
