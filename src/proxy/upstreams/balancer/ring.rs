//! The bit and ring arithmetic of a pick: the `n`th candidate of a bit
//! set, the first candidate clockwise on the hash ring, and the hash that
//! places endpoints and keys on it.

/// The index of the `n`th set bit of `bits`.
pub(super) fn nth_set_bit(mut bits: u128, n: u32) -> usize {
    // Every endpoint a candidate (the low bits all set, the common case):
    // the `n`th is `n`.
    if bits != 0 && bits & bits.wrapping_add(1) == 0 {
        return n as usize;
    }
    for _ in 0..n {
        bits &= bits - 1;
    }
    bits.trailing_zeros() as usize
}

/// The first candidate clockwise from `key` on `ring` (`(point, index)`
/// sorted by point).
pub(super) fn ring_pick(ring: &[(u64, usize)], key: u64, candidates: u128) -> usize {
    if ring.is_empty() {
        return 0;
    }
    let start = ring.partition_point(|&(p, _)| p < key);
    for k in 0..ring.len() {
        let (_, i) = ring[(start + k) % ring.len()];
        if i >= 128 || candidates & (1 << i) != 0 {
            return i;
        }
    }
    0
}

/// FNV-1a with a final mix (splitmix64's), so that similar names land far
/// apart on the ring.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
