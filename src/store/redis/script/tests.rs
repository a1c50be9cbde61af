use super::*;
use crate::limit::Algorithm;

fn ints(v: &[i64]) -> Vec<Value> {
    v.iter().copied().map(Value::Integer).collect()
}

#[test]
fn parses_a_well_formed_reply() {
    let reply = Value::Array(ints(&[0, 1, 4, 20_000, 0, 0, 0, 18_000, -1]));
    let mut replies = parse_replies(reply, [2].into_iter()).unwrap();
    let d = replies.pop().unwrap().unwrap();
    assert!(!d.allowed);
    assert_eq!(d.outcomes[0].retry_after_ms, Some(0));
    assert_eq!(d.outcomes[1].retry_after_ms, None);
}

#[test]
fn splits_a_flat_batch_reply_with_an_error_in_it() {
    // One limit, an error, two limits: 5 + 1 + 9 entries.
    let mut items = ints(&[1, 1, 9, 1_000, 0]);
    items.push(Value::from(
        "ERR tollgate limits: k does not hold a counter",
    ));
    items.extend(ints(&[1, 1, 3, 500, 0, 1, 7, 900, 0]));
    let replies = parse_replies(Value::Array(items), [1, 2, 2].into_iter()).unwrap();
    assert_eq!(replies.len(), 3);
    assert_eq!(replies[0].as_ref().unwrap().outcomes[0].remaining, 9);
    assert!(matches!(&replies[1], Err(StoreError::Protocol(m)) if m.contains("does not hold")));
    let d = replies[2].as_ref().unwrap();
    assert!(d.allowed);
    assert_eq!((d.outcomes[0].remaining, d.outcomes[1].remaining), (3, 7));
}

#[test]
fn rejects_replies_of_the_wrong_shape() {
    // Wrong numbers fail their request; a reply whose requests cannot be
    // told apart fails the whole call.
    for (items, n) in [
        (ints(&[1, 2, 0, 0, 0]), 1),  // flag 2
        (ints(&[1, 1, -3, 0, 0]), 1), // negative remaining
        (ints(&[1, 0, 0, 0, 5]), 1),  // allowed though a limit denies
        (ints(&[0, 1, 0, 0, -2]), 1), // retry below −1
    ] {
        let replies = parse_replies(Value::Array(items), [n].into_iter()).unwrap();
        assert!(matches!(replies[0], Err(StoreError::Protocol(_))));
    }
    for (reply, n) in [
        (Value::Null, 1),
        (Value::Array(ints(&[1, 1, 0, 0])), 1), // too short
        (Value::Array(ints(&[1, 1, 0, 0, 0, 1])), 1), // too long
        (Value::Array(vec![Value::Integer(1), Value::from("1")]), 1), // not an integer
        (Value::Array(vec![]), 1),              // no answer
    ] {
        assert!(matches!(
            parse_replies(reply, [n].into_iter()),
            Err(StoreError::Protocol(_))
        ));
    }
}

#[test]
fn a_batch_sends_each_shape_once_and_its_requests_as_runs() {
    let req = |key: &str, cost| LimitRequest {
        key: key.into(),
        limit: 10,
        window_ms: 1_000,
        cost,
        algorithm: Algorithm::SlidingWindow,
        mode: Default::default(),
    };
    let encode = |key: &str, now, cost| Encoded::new(now, &[req(key, cost)], false).unwrap();
    let batch = [
        encode("a", 7, 1),
        encode("b", 7, 2),
        encode("c", 7, 1),
        encode("d", 8, 1),
        encode("e", 8, 1),
    ];
    let sha = Str::from("0".repeat(40));
    let mut expected = vec![Value::String(sha.clone()), Value::Integer(5)];
    expected.extend(["a", "b", "c", "d", "e"].map(Value::from));
    expected.push(Value::Integer(2)); // two shapes: cost 1 and cost 2
    expected.extend(ints(&[1, 0, 10, 1_000, 1, 10]));
    expected.extend(ints(&[1, 0, 10, 1_000, 2, 10]));
    // (shape, now, count): a; b; c; d and e together
    expected.extend(ints(&[1, 7, 1, 2, 7, 1, 1, 7, 1, 1, 8, 2]));
    assert_eq!(evalsha_args(&sha, batch.iter()), expected);

    // clock: redis sends TIME in place of the instant.
    let server = Encoded::new(7, &[req("a", 1)], true).unwrap();
    let args = evalsha_args(&sha, std::iter::once(&server));
    assert_eq!(args[args.len() - 2], Value::from(SERVER_CLOCK));
}

#[test]
fn refuses_arguments_beyond_exact_doubles() {
    let req = |limit| LimitRequest {
        key: "k".into(),
        limit,
        window_ms: 1_000,
        cost: 1,
        algorithm: Algorithm::SlidingWindow,
        mode: Default::default(),
    };
    assert!(Encoded::new(1 << 53, &[], false).is_err());
    assert!(Encoded::new((1 << 53) - 1, &[], false).is_ok());
    assert!(Encoded::new(0, &[req(1 << 53)], false).is_err());
    assert!(Encoded::new(0, &[req((1 << 53) - 1)], false).is_ok());
}
