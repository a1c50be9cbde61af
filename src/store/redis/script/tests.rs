use super::*;

#[test]
fn parses_a_well_formed_reply() {
    let reply = Value::Array(
        [0, 1, 4, 20_000, 0, 0, 0, 18_000, -1]
            .into_iter()
            .map(Value::Integer)
            .collect(),
    );
    let d = parse_reply(reply, 2).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.outcomes[0].retry_after_ms, Some(0));
    assert_eq!(d.outcomes[1].retry_after_ms, None);
}

#[test]
fn rejects_replies_of_the_wrong_shape() {
    let ints = |v: &[i64]| Value::Array(v.iter().copied().map(Value::Integer).collect());
    for (reply, n) in [
        (Value::Null, 1),
        (ints(&[1, 1, 0, 0]), 1),                  // too short
        (ints(&[1, 2, 0, 0, 0]), 1),               // flag 2
        (ints(&[1, 1, -3, 0, 0]), 1),              // negative remaining
        (ints(&[1, 0, 0, 0, 5]), 1),               // allowed though a limit denies
        (ints(&[0, 1, 0, 0, -2]), 1),              // retry below −1
        (Value::Array(vec![Value::from("1")]), 0), // not an integer
    ] {
        assert!(matches!(
            parse_reply(reply, n),
            Err(StoreError::Protocol(_))
        ));
    }
}

#[test]
fn a_batch_sends_each_shape_once() {
    let req = |key: &str, cost| LimitRequest {
        key: key.into(),
        limit: 10,
        window_ms: 1_000,
        cost,
        algorithm: Algorithm::SlidingWindow,
    };
    let encode = |key: &str, cost| Encoded {
        keys: vec![Value::from(key)],
        shape: script_args(7, &[req(key, cost)]).unwrap(),
    };
    let batch = [encode("a", 1), encode("b", 2), encode("c", 1)];
    let sha = Str::from("0".repeat(40));
    let ints = |v: &[i64]| v.iter().copied().map(Value::Integer).collect::<Vec<_>>();
    let mut expected = vec![Value::String(sha.clone()), Value::Integer(3)];
    expected.extend(["a", "b", "c"].map(Value::from));
    expected.push(Value::Integer(2)); // two shapes: cost 1 and cost 2
    expected.extend(ints(&[1, 7, 0, 10, 1_000, 1, 10]));
    expected.extend(ints(&[1, 7, 0, 10, 1_000, 2, 10]));
    expected.extend(ints(&[1, 2, 1])); // a and c share the first
    assert_eq!(evalsha_args(&sha, batch.iter()), expected);
}

#[test]
fn refuses_arguments_beyond_exact_doubles() {
    assert!(script_args(1 << 53, &[]).is_err());
    assert!(script_args((1 << 53) - 1, &[]).is_ok());
}
