//! Serde mirror of the YAML file: stage one of loading.
//!
//! These structs follow the file's shape and nothing more; every rule about
//! values (durations, addresses, required fields, exclusive fields) lives in
//! [`load`](super::load), which turns them into the validated model.
//!
//! The shape is built so that one mistake never hides another:
//!
//! - Every field is a [`Field`], which *keeps* a type error instead of
//!   returning it. A map where a string belongs makes that one field
//!   [`Field::Invalid`]; the rest of the file is still read and checked.
//! - Leaves ([`Text`], [`Int`], [`OneOrMany`]) read a whole
//!   [`yaml_serde::Value`] first, so they always consume their node and can
//!   say what they found ("expected a string, found a mapping").
//! - Structs do not use `deny_unknown_fields`, which would stop at the first
//!   unknown field. [`from_value`] runs the deserializer under
//!   `serde_ignored` and returns every ignored key instead, with the list of
//!   fields that were expected at that place.
//!
//! [`Field`] may swallow an error only because the input is a
//! [`yaml_serde::Value`]: its map and sequence accessors take each node out
//! before handing it over, so a failed node leaves its parent readable. A
//! streaming deserializer would be left mid-node, which is why
//! [`from_value`] is the only entry point.
//!
//! | `file/` | holds |
//! |---|---|
//! | `mappings.rs` | the structs, one per mapping of the file, from [`Root`] down |
//! | `pools.rs` | those of `upstreams:` |
//! | `leaf.rs` | the leaves and [`Field`] |
//! | `unknown.rs` | [`from_value`] and the unknown-field lists |
//! | `shape.rs` | what durations, windows, sizes and enum fields look like in the schema |
//!
//! This file only names what the loader and the schema use. The schema
//! (`tollgate schema`) is derived from the same structs, with each enum
//! field's `enum` taken from the spellings table its loader reads
//! (`#[schemars(extend("enum" = spellings(…)))]`).

mod leaf;
mod mappings;
mod pools;
mod server;
mod shape;
mod unknown;

pub use leaf::{Field, Flag, Int, OneOrMany, Text};
pub use mappings::{
    AccessLog, Admin, AdminMap, ApiKeys, Breaker, ClientIp, Cors, Cost, CostMap, Exempt, FromBody,
    FromBodyMap, HeaderRules, Jwt, Limit, Listen, ListenMap, Match, PlanLimit, Reconnect, Redis,
    RedisTls, RequestId, Reserve, ReserveMap, Respond, Root, Route, Sentinel, Store, Timeouts, Tls,
    Tracing, Users,
};
pub use pools::{Eject, Health, Target, TargetMap, UpstreamPool};
pub use server::{Server, ServerPath};
pub use unknown::{UnknownField, from_value};

#[cfg(test)]
mod tests {
    use yaml_serde::Value;

    use super::unknown::fields_of;
    use super::*;

    fn read(src: &str) -> (Result<Root, String>, Vec<UnknownField>) {
        let value: Value = yaml_serde::from_str(src).expect("test YAML parses");
        from_value(value)
    }

    #[test]
    fn a_bad_field_does_not_stop_the_rest() {
        let (root, unknown) = read("headers: {a: 1}\nroutes: [{name: [x], cost: 2, nope: 1}, 7]\n");
        let root = root.expect("root reads");
        assert_eq!(
            root.headers,
            Field::Invalid("expected a string, found a mapping".into())
        );
        let Field::Valid(routes) = &root.routes else {
            panic!("routes: {:?}", root.routes)
        };
        let Field::Valid(route) = &routes[0] else {
            panic!("route: {:?}", routes[0])
        };
        assert_eq!(
            route.name,
            Field::Invalid("expected a string, found a list".into())
        );
        assert_eq!(route.cost, Field::Valid(Int(2)));
        assert_eq!(
            routes[1],
            Field::Invalid("expected a mapping, found the number 7".into())
        );
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].parent, "routes[0]");
        assert_eq!(unknown[0].key, "nope");
        assert_eq!(unknown[0].expected, fields_of::<Route>());
    }

    #[test]
    fn null_is_absent_and_scalars_are_text() {
        let (root, _) = read("listen:\nheaders: 12\nstore: ~\n");
        let root = root.expect("root reads");
        assert!(root.listen.is_absent());
        assert!(root.store.is_absent());
        assert_eq!(root.headers, Field::Valid(Text("12".into())));
    }

    #[test]
    fn one_or_many() {
        let (root, _) = read("listen: [a, [b], ~, {addr: c, b: 1}]\n");
        let root = root.expect("root reads");
        assert_eq!(
            root.listen,
            Field::Valid(OneOrMany::Many(vec![
                Field::Valid(Listen::Addr(Text("a".into()))),
                Field::Invalid(
                    "expected an address or a mapping { addr, tls }, found a list".into()
                ),
                Field::Absent,
                Field::Invalid("unknown field `b`, expected `addr` or `tls`".into()),
            ]))
        );
    }
}
