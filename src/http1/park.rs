//! Idle keep-alive connections parked without a task each.
//!
//! A connection that has waited [`LINGER`](super::conn::LINGER) for its
//! next head with no byte come is handed here by its task, which then
//! ends: what waits is the socket, when it went idle, and the little its
//! owner needs to serve it again (`T`). One parker task per listener
//! waits for all of them to be readable and, when one is, hands it back
//! through its `wake` to be served on a task again: a spawn per busy
//! period after an idle, not per request.
//!
//! Readiness is waited for with one small future per socket in a
//! `FuturesUnordered`, each peeking one byte with the socket's own
//! `poll_peek`: the socket's waker is the set's node, not a task. A peek
//! that finds the client's end closes the socket here, with no task.
//!
//! What a connection holds for `max_connections` (its permit, `T`) is
//! not kept beside its socket: the parker merges the permits of every
//! socket it holds into one ([`Permits`]), splits one off for each socket
//! it hands back and gives one back for each it closes, so that it holds
//! exactly one per parked socket and a parked socket's entry is its
//! handle and a 4-byte offset of when it went idle.
//!
//! The idle timeout is one timer for the parker, not one per socket:
//! sockets are kept in buckets by when they went idle, an eighth of the
//! timeout each, and a bucket is closed whole once its last socket has
//! been idle for the timeout. A parked socket therefore closes between
//! the timeout and an eighth of it later. When the gateway drains
//! (`stop` turns true) every parked socket is closed at once and the
//! parker ends.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tokio::time::{Instant, Sleep};

/// Permits the parker keeps for all its sockets at once (see the module's
/// documentation).
pub trait Permits: Sized {
    /// Adds `self` to `all`; `Err(self)` when the two cannot be one (the
    /// socket is then closed, and its permit given back).
    ///
    /// # Errors
    /// `self` cannot join `all`.
    fn merge_into(self, all: &mut Option<Self>) -> Result<(), Self>;

    /// Takes `n` out of `all`: to hand on with a socket, or to drop for
    /// sockets closed. `None` when `all` holds fewer.
    fn split_off(all: &mut Option<Self>, n: usize) -> Option<Self>;
}

impl Permits for OwnedSemaphorePermit {
    fn merge_into(self, all: &mut Option<Self>) -> Result<(), Self> {
        match all {
            None => *all = Some(self),
            // `merge` panics on permits of two semaphores.
            Some(a) if std::sync::Arc::ptr_eq(a.semaphore(), self.semaphore()) => a.merge(self),
            Some(_) => return Err(self),
        }
        Ok(())
    }

    fn split_off(all: &mut Option<Self>, n: usize) -> Option<Self> {
        all.as_mut()?.split(n)
    }
}

/// An idle connection: its socket, when it went idle, and what its owner
/// serves it with again.
#[derive(Debug)]
pub struct Parked<T> {
    /// The connection's socket, with nothing unread in its buffers.
    pub stream: TcpStream,
    /// When the connection began to wait for its next head (handed back
    /// to the millisecond, rounded down).
    pub since: Instant,
    /// Its `max_connections` permit, which the parker keeps with its
    /// own while the socket is parked.
    pub with: T,
}

/// Where a connection's task parks its socket; one per listener, cloned
/// into each connection's task.
#[derive(Debug)]
pub struct Park<T> {
    tx: mpsc::UnboundedSender<Parked<T>>,
}

impl<T> Clone for Park<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<T> Park<T> {
    /// Parks `parked`. Once the parker has ended (the gateway drains) the
    /// socket is closed instead.
    pub fn park(&self, parked: Parked<T>) {
        // A parker that has ended gives the socket back, to be dropped.
        let _ = self.tx.send(parked);
    }
}

/// What a parked socket's wait came to.
enum Woke {
    /// Bytes to read: the connection is to be served again.
    Bytes(Held),
    /// The client closed, or the socket failed.
    Closed,
}

/// A parked socket as the parker keeps it: when it went idle, in
/// milliseconds after the start of its bucket's stretch, which is all the
/// precision the deadlines it is served again with need. Its permit is in
/// the parker's.
struct Held {
    stream: TcpStream,
    idle_ms: u32,
}

/// One parked socket's wait for a byte to read.
struct Waiting(Option<Held>);

impl Future for Waiting {
    type Output = Woke;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woke> {
        let this = self.get_mut();
        let Some(held) = &this.0 else {
            return Poll::Pending;
        };
        let mut byte = [MaybeUninit::uninit()];
        let mut buf = ReadBuf::uninit(&mut byte);
        let peeked = ready!(held.stream.poll_peek(cx, &mut buf));
        Poll::Ready(match (peeked, this.0.take()) {
            (Ok(n), Some(held)) if n > 0 => Woke::Bytes(held),
            _ => Woke::Closed,
        })
    }
}

/// The sockets that went idle within one stretch of `grain_ms`.
struct Bucket {
    /// Which stretch since the parker's epoch.
    index: u64,
    waiting: FuturesUnordered<Waiting>,
}

/// Waits for parked sockets; see the module's documentation.
pub struct Parker<T, F> {
    rx: mpsc::UnboundedReceiver<Parked<T>>,
    /// Oldest first.
    buckets: VecDeque<Bucket>,
    /// One permit for each socket in `buckets`, merged.
    permits: Option<T>,
    epoch: Instant,
    /// How long a bucket's stretch is, in whole milliseconds, at least 1.
    grain_ms: u64,
    timeout: Duration,
    stop: watch::Receiver<bool>,
    /// Lent to `wake`, to park again what it serves.
    park: Park<T>,
    wake: F,
}

/// A parker closing sockets idle for `timeout`, all of them once `stop`
/// turns true, and handing each that becomes readable to `wake` (with a
/// handle to park it again); and the handle that parks with it. The parker is a future to spawn; it ends
/// once `stop` turns true.
pub fn parker<T, F>(
    timeout: Duration,
    stop: watch::Receiver<bool>,
    wake: F,
) -> (Park<T>, Parker<T, F>)
where
    T: Permits,
    F: FnMut(Parked<T>, &Park<T>),
{
    let (tx, rx) = mpsc::unbounded_channel();
    let park = Park { tx };
    let parker = Parker {
        rx,
        buckets: VecDeque::new(),
        permits: None,
        epoch: Instant::now(),
        grain_ms: u64::try_from((timeout / 8).as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
        timeout,
        stop,
        park: park.clone(),
        wake,
    };
    (park, parker)
}

impl<T: Permits, F: FnMut(Parked<T>, &Park<T>)> Parker<T, F> {
    /// Waits for parked sockets until `stop` turns true, then closes them.
    pub async fn run(mut self) {
        let mut stop = self.stop.clone();
        let mut drained = pin!(async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        });
        let mut sweep = pin!(tokio::time::sleep(self.timeout));
        poll_fn(|cx| {
            if drained.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            while let Poll::Ready(parked) = self.rx.poll_recv(cx) {
                // The parker keeps a sender itself: the channel never ends.
                if let Some(p) = parked {
                    self.insert(p);
                }
            }
            self.poll_woken(cx);
            self.poll_sweep(sweep.as_mut(), cx);
            Poll::Pending
        })
        .await;
        // Dropping the buckets closes every socket still parked, and the
        // permits go back with `permits`.
    }

    /// Which bucket a socket idle since `idle_ms` goes in.
    fn index(&self, idle_ms: u64) -> u64 {
        idle_ms / self.grain_ms
    }

    /// When the bucket `index` closes: once a socket that went idle at
    /// its stretch's end has been idle for the timeout.
    fn closes(&self, index: u64) -> Instant {
        let ends = Duration::from_millis(index.saturating_add(1).saturating_mul(self.grain_ms));
        // Past what the clock counts: not within the gateway's life.
        self.epoch
            .checked_add(ends.saturating_add(self.timeout))
            .unwrap_or_else(|| self.epoch + Duration::from_secs(86_400 * 365 * 30))
    }

    fn insert(&mut self, parked: Parked<T>) {
        let Parked {
            stream,
            since,
            with,
        } = parked;
        let after = since.saturating_duration_since(self.epoch).as_millis();
        let idle_ms = u64::try_from(after).unwrap_or(u64::MAX);
        let index = self.index(idle_ms);
        if with.merge_into(&mut self.permits).is_err() {
            // Closed, its permit given back: one the parker cannot keep.
            return;
        }
        let at = self.buckets.iter().rposition(|b| b.index <= index);
        let at = match at {
            Some(i) if self.buckets[i].index == index => i,
            Some(i) => self.new_bucket(i + 1, index),
            None => self.new_bucket(0, index),
        };
        // Less than `grain_ms`; a stretch past 49 days keeps 49 of it.
        let into = idle_ms - index.saturating_mul(self.grain_ms);
        let held = Held {
            stream,
            idle_ms: u32::try_from(into).unwrap_or(u32::MAX),
        };
        self.buckets[at].waiting.push(Waiting(Some(held)));
    }

    fn new_bucket(&mut self, at: usize, index: u64) -> usize {
        let waiting = FuturesUnordered::new();
        self.buckets.insert(at, Bucket { index, waiting });
        at
    }

    /// Hands on the sockets that became readable, each with a permit split
    /// off the parker's, drops those that closed with theirs, and the
    /// buckets left empty.
    fn poll_woken(&mut self, cx: &mut Context<'_>) {
        for bucket in &mut self.buckets {
            while let Poll::Ready(Some(woke)) = bucket.waiting.poll_next_unpin(cx) {
                let with = T::split_off(&mut self.permits, 1);
                if let (Woke::Bytes(held), Some(with)) = (woke, with) {
                    let Held { stream, idle_ms } = held;
                    let start = bucket.index.saturating_mul(self.grain_ms);
                    let idle_ms = start.saturating_add(u64::from(idle_ms));
                    let since = self.epoch + Duration::from_millis(idle_ms);
                    (self.wake)(
                        Parked {
                            stream,
                            since,
                            with,
                        },
                        &self.park,
                    );
                }
            }
        }
        self.buckets.retain(|b| !b.waiting.is_empty());
    }

    /// Closes the buckets whose time is up, and sets the timer for the
    /// next.
    fn poll_sweep(&mut self, mut sweep: Pin<&mut Sleep>, cx: &mut Context<'_>) {
        loop {
            let Some(front) = self.buckets.front() else {
                return;
            };
            let due = self.closes(front.index);
            if sweep.deadline() != due {
                sweep.as_mut().reset(due);
            }
            if sweep.as_mut().poll(cx).is_pending() {
                return;
            }
            if let Some(closed) = self.buckets.pop_front() {
                let n = closed.waiting.len();
                drop(closed);
                drop(T::split_off(&mut self.permits, n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;

    type Permit = OwnedSemaphorePermit;

    /// A connected pair: the server's side and the client's.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound");
        let (accepted, client) = tokio::join!(listener.accept(), TcpStream::connect(addr));
        (accepted.expect("accepted").0, client.expect("connected"))
    }

    /// A parker for `timeout` whose woken sockets come out of the receiver,
    /// and the semaphore of 10 permits its sockets' permits come from.
    struct Started {
        park: Park<Permit>,
        woke: mpsc::UnboundedReceiver<Parked<Permit>>,
        stop: watch::Sender<bool>,
        parker: tokio::task::JoinHandle<()>,
        sem: Arc<Semaphore>,
    }

    fn started(timeout: Duration) -> Started {
        let (stop, stop_rx) = watch::channel(false);
        let (woke_tx, woke) = mpsc::unbounded_channel();
        let (park, parker) = parker(timeout, stop_rx, move |p, _: &Park<Permit>| {
            let _ = woke_tx.send(p);
        });
        Started {
            park,
            woke,
            stop,
            parker: tokio::spawn(parker.run()),
            sem: Arc::new(Semaphore::new(10)),
        }
    }

    impl Started {
        /// Parks `stream`, idle since `since`, with a permit of its own;
        /// the address it is known by.
        fn park(&self, stream: TcpStream, since: Instant) -> SocketAddr {
            let at = stream.local_addr().expect("bound");
            let with = self.sem.clone().try_acquire_owned().expect("a permit");
            self.park.park(Parked {
                stream,
                since,
                with,
            });
            at
        }

        /// Waits until the semaphore has `n` permits free.
        async fn free(&self, n: usize) {
            let wait = async {
                while self.sem.available_permits() != n {
                    tokio::task::yield_now().await;
                }
            };
            let waited = tokio::time::timeout(Duration::from_secs(5), wait).await;
            assert!(
                waited.is_ok(),
                "{} permits free, not {n}",
                self.sem.available_permits()
            );
        }
    }

    /// Whether the peer of `client` closed it within `within`.
    async fn closed_within(client: &mut TcpStream, within: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(within, client.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn a_parked_socket_is_handed_back_with_its_bytes_unread_and_one_permit() {
        let mut p = started(Duration::from_secs(30));
        let (quiet, quiet_client) = pair().await;
        let (server, mut client) = pair().await;
        let since = Instant::now();
        p.park(quiet, since);
        let written = p.park(server, since);
        client.write_all(b"GET").await.expect("sent");
        let mut back = p.woke.recv().await.expect("woken");
        assert_eq!(back.stream.local_addr().ok(), Some(written));
        assert_eq!(back.with.num_permits(), 1, "its own permit");
        assert_eq!(p.sem.available_permits(), 8, "two parked, two held");
        assert!(
            back.since <= since && since - back.since < Duration::from_millis(1),
            "when it went idle, to the millisecond"
        );
        let mut got = [0u8; 3];
        back.stream.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET", "the peek left the bytes to be read");
        // Parked again, it is handed back again at its next bytes; the
        // quiet one never is.
        p.park.park(back);
        client.write_all(b"PUT").await.expect("sent");
        let again = p.woke.recv().await.expect("woken");
        assert_eq!(again.stream.local_addr().ok(), Some(written));
        assert!(
            p.woke.try_recv().is_err(),
            "the quiet socket was handed back"
        );
        // Its permit goes back when the owner drops it; the quiet one's
        // when its client closes.
        drop(again);
        assert_eq!(p.sem.available_permits(), 9);
        drop(quiet_client);
        p.free(10).await;
    }

    #[tokio::test]
    async fn a_parked_socket_idle_for_the_timeout_is_closed_within_an_eighth_more() {
        let timeout = Duration::from_millis(400);
        let mut p = started(timeout);
        let (server, mut client) = pair().await;
        let since = Instant::now();
        p.park(server, since);
        assert!(closed_within(&mut client, Duration::from_secs(5)).await);
        let after = since.elapsed();
        assert!(
            after >= timeout && after < timeout + timeout / 8 + Duration::from_millis(100),
            "closed after {after:?}, the timeout is {timeout:?}"
        );
        assert!(
            p.woke.try_recv().is_err(),
            "a closed socket was handed back"
        );
        p.free(10).await;
    }

    #[tokio::test]
    async fn the_drain_closes_every_parked_socket_and_ends_the_parker() {
        let p = started(Duration::from_secs(30));
        let mut clients = Vec::new();
        for _ in 0..3 {
            let (server, client) = pair().await;
            p.park(server, Instant::now());
            clients.push(client);
        }
        p.free(7).await;
        p.stop.send(true).expect("the parker listens");
        tokio::time::timeout(Duration::from_secs(5), p.parker)
            .await
            .expect("the parker ended")
            .expect("the parker did not panic");
        for client in &mut clients {
            assert!(closed_within(client, Duration::from_secs(1)).await);
        }
        assert_eq!(p.sem.available_permits(), 10, "every permit back");
        // Parked after the drain: closed at once, its permit back.
        let (server, mut client) = pair().await;
        let with = p.sem.clone().try_acquire_owned().expect("a permit");
        p.park.park(Parked {
            stream: server,
            since: Instant::now(),
            with,
        });
        assert!(closed_within(&mut client, Duration::from_secs(1)).await);
        assert_eq!(p.sem.available_permits(), 10);
    }

    #[test]
    fn a_permit_of_another_semaphore_is_not_merged() {
        let (one, other) = (Arc::new(Semaphore::new(2)), Arc::new(Semaphore::new(1)));
        let mut all = None;
        for _ in 0..2 {
            let p = one.clone().try_acquire_owned().expect("a permit");
            assert!(p.merge_into(&mut all).is_ok());
        }
        let stray = other.clone().try_acquire_owned().expect("a permit");
        assert!(stray.merge_into(&mut all).is_err());
        assert_eq!(other.available_permits(), 1, "the stray one went back");
        let one_back = Permit::split_off(&mut all, 1).expect("two held");
        assert_eq!(one_back.num_permits(), 1);
        assert!(Permit::split_off(&mut all, 2).is_none(), "one left");
        drop(one_back);
        assert_eq!(one.available_permits(), 1);
        drop(all);
        assert_eq!(one.available_permits(), 2);
    }

    #[test]
    fn a_parked_socket_waits_in_little_more_than_its_handle() {
        let waiting = std::mem::size_of::<Waiting>();
        let handle = std::mem::size_of::<TcpStream>();
        // `FuturesUnordered` keeps it as an `Option` in its node, beside
        // five links and two flags, in an `Arc`.
        let kept = std::mem::size_of::<Option<Waiting>>();
        println!("a parked socket's wait: {waiting} bytes ({kept} kept); its handle: {handle}");
        assert!(
            kept <= handle + 8,
            "a parked socket's wait is {kept} bytes, its handle {handle}"
        );
    }
}
