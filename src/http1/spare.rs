//! Buffers the connections of one thread share: a connection that waits
//! for its next request gives its buffers back here and takes them again
//! when bytes come, so that an idle connection holds no buffer and a busy
//! one allocates none per request.
//!
//! Each thread keeps at most [`KEPT`] of each kind, none larger than
//! [`LARGEST`]: what a burst of connections grew beyond that is freed.
//!
//! A request's header map is kept the same way: the forwarder gives it
//! back, emptied, once the request is sent ([`give_map`]), and the next
//! head read on the thread fills it ([`header_map`]) instead of allocating
//! a map's two tables and freeing them per request. Up to
//! [`KEPT_MAPS`] are kept, as many requests as wait for their upstreams at
//! once on a busy thread, none with room for more than [`LARGEST_MAP`]
//! fields.

use std::cell::RefCell;

use bytes::BytesMut;
use http::HeaderMap;

/// The room a read buffer has when taken (hyper's first read buffer is as
/// large).
pub(super) const READ_SIZE: usize = 8 * 1024;
/// The room a write buffer has when taken: a head and a small body.
const WRITE_SIZE: usize = 4 * 1024;
/// Buffers of each kind a thread keeps.
const KEPT: usize = 16;
/// A buffer with more room than this is freed, not kept.
const LARGEST: usize = 64 * 1024;

/// Header maps a thread keeps.
const KEPT_MAPS: usize = 64;
/// A map with room for more fields than this is freed, not kept.
const LARGEST_MAP: usize = 48;

thread_local! {
    static READ: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static WRITE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty read buffer with room for [`READ_SIZE`] bytes.
pub(super) fn read_buffer() -> BytesMut {
    let mut buf = READ.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    // A kept buffer may still share its bytes with a request's parts that
    // outlive it: `reserve` reuses the memory only when nothing else
    // holds it, and allocates otherwise.
    buf.reserve(READ_SIZE);
    buf
}

/// An empty write buffer.
pub(super) fn write_buffer() -> Vec<u8> {
    WRITE
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| Vec::with_capacity(WRITE_SIZE))
}

/// Keeps `buf`, emptied, for the next connection that reads.
pub(super) fn give_read(mut buf: BytesMut) {
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    let _ = READ.try_with(|s| keep(&mut s.borrow_mut(), buf));
}

/// Keeps `buf`, emptied, for the next connection that writes.
pub(super) fn give_write(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > LARGEST {
        return;
    }
    buf.clear();
    let _ = WRITE.try_with(|s| keep(&mut s.borrow_mut(), buf));
}

/// An empty header map with room for `fields` fields: one the thread
/// keeps when it has room enough, a new one otherwise.
pub fn header_map(fields: usize) -> HeaderMap {
    match MAPS.with(|s| s.borrow_mut().pop()) {
        Some(map) if map.capacity() >= fields => map,
        // Too small: dropped, and the thread keeps one map fewer.
        _ => HeaderMap::with_capacity(fields),
    }
}

/// Keeps `map`, emptied, for the next head read on this thread.
pub fn give_map(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > LARGEST_MAP {
        return;
    }
    map.clear();
    let _ = MAPS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEPT_MAPS {
            s.push(map);
        }
    });
}

/// How many read and write buffers this thread keeps.
#[cfg(test)]
pub(super) fn kept() -> (usize, usize) {
    (
        READ.with(|s| s.borrow().len()),
        WRITE.with(|s| s.borrow().len()),
    )
}

fn keep<T>(spares: &mut Vec<T>, buf: T) {
    if spares.len() < KEPT {
        spares.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_with_its_memory() {
        let mut buf = read_buffer();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let head = buf.split_to(buf.len()).freeze();
        let at = head.as_ptr();
        drop(head);
        give_read(buf);
        let again = read_buffer();
        assert!(again.is_empty() && again.capacity() >= READ_SIZE);
        assert_eq!(again.as_ptr(), at, "the same memory, reclaimed");
    }

    #[test]
    fn a_buffer_still_shared_is_not_written_over() {
        let mut buf = read_buffer();
        buf.extend_from_slice(b"kept");
        let held = buf.split_to(4).freeze();
        give_read(buf);
        let mut again = read_buffer();
        again.extend_from_slice(b"next");
        assert_eq!(&held[..], b"kept");
    }

    #[test]
    fn a_map_given_back_is_taken_again_empty() {
        let mut map = header_map(5);
        map.insert(http::header::HOST, http::HeaderValue::from_static("a"));
        let room = map.capacity();
        give_map(map);
        let again = header_map(5);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room, "the same tables");
        // One with too little room is not handed out.
        give_map(again);
        assert!(header_map(room + 1).capacity() > room);
    }

    #[test]
    fn large_buffers_are_freed() {
        give_write(Vec::with_capacity(LARGEST + 1));
        assert!(write_buffer().capacity() <= LARGEST);
    }
}
