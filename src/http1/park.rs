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
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Sleep};

/// An idle connection: its socket, when it went idle, and what its owner
/// serves it with again.
#[derive(Debug)]
pub struct Parked<T> {
    /// The connection's socket, with nothing unread in its buffers.
    pub stream: TcpStream,
    /// When the connection began to wait for its next head (handed back
    /// to the millisecond, rounded down).
    pub since: Instant,
    /// What the owner keeps with it.
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
enum Woke<T> {
    /// Bytes to read: the connection is to be served again.
    Bytes(Held<T>),
    /// The client closed, or the socket failed.
    Closed,
}

/// A parked socket as the parker keeps it: when it went idle in
/// milliseconds after the parker's epoch, which is all the precision the
/// deadlines it is served again with need.
struct Held<T> {
    stream: TcpStream,
    idle_ms: u64,
    with: T,
}

/// One parked socket's wait for a byte to read.
struct Waiting<T>(Option<Held<T>>);

impl<T: Unpin> Future for Waiting<T> {
    type Output = Woke<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woke<T>> {
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
struct Bucket<T> {
    /// Which stretch since the parker's epoch.
    index: u64,
    waiting: FuturesUnordered<Waiting<T>>,
}

/// Waits for parked sockets; see the module's documentation.
pub struct Parker<T, F> {
    rx: mpsc::UnboundedReceiver<Parked<T>>,
    /// Oldest first.
    buckets: VecDeque<Bucket<T>>,
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
    T: Unpin,
    F: FnMut(Parked<T>, &Park<T>),
{
    let (tx, rx) = mpsc::unbounded_channel();
    let park = Park { tx };
    let parker = Parker {
        rx,
        buckets: VecDeque::new(),
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

impl<T: Unpin, F: FnMut(Parked<T>, &Park<T>)> Parker<T, F> {
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
        // Dropping the buckets closes every socket still parked.
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
        let at = self.buckets.iter().rposition(|b| b.index <= index);
        let at = match at {
            Some(i) if self.buckets[i].index == index => i,
            Some(i) => self.new_bucket(i + 1, index),
            None => self.new_bucket(0, index),
        };
        let held = Held {
            stream,
            idle_ms,
            with,
        };
        self.buckets[at].waiting.push(Waiting(Some(held)));
    }

    fn new_bucket(&mut self, at: usize, index: u64) -> usize {
        let waiting = FuturesUnordered::new();
        self.buckets.insert(at, Bucket { index, waiting });
        at
    }

    /// Hands on the sockets that became readable, drops those that closed,
    /// and the buckets left empty.
    fn poll_woken(&mut self, cx: &mut Context<'_>) {
        for bucket in &mut self.buckets {
            while let Poll::Ready(Some(woke)) = bucket.waiting.poll_next_unpin(cx) {
                if let Woke::Bytes(held) = woke {
                    let Held {
                        stream,
                        idle_ms,
                        with,
                    } = held;
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
            self.buckets.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair: the server's side and the client's.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("bound");
        let (accepted, client) = tokio::join!(listener.accept(), TcpStream::connect(addr));
        (accepted.expect("accepted").0, client.expect("connected"))
    }

    /// A parker for `timeout` whose woken sockets come out of the receiver.
    fn started(
        timeout: Duration,
    ) -> (
        Park<u32>,
        mpsc::UnboundedReceiver<Parked<u32>>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop_tx, stop) = watch::channel(false);
        let (woke_tx, woke) = mpsc::unbounded_channel();
        let (park, parker) = parker(timeout, stop, move |p, _: &Park<u32>| {
            let _ = woke_tx.send(p);
        });
        (park, woke, stop_tx, tokio::spawn(parker.run()))
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
    async fn a_parked_socket_is_handed_back_with_its_bytes_unread() {
        let (park, mut woke, _stop, _parker) = started(Duration::from_secs(30));
        let (quiet, _quiet_client) = pair().await;
        let (server, mut client) = pair().await;
        let since = Instant::now();
        park.park(Parked {
            stream: quiet,
            since,
            with: 1,
        });
        park.park(Parked {
            stream: server,
            since,
            with: 2,
        });
        client.write_all(b"GET").await.expect("sent");
        let mut back = woke.recv().await.expect("woken");
        assert_eq!(back.with, 2, "the socket written to");
        assert!(
            back.since <= since && since - back.since < Duration::from_millis(1),
            "when it went idle, to the millisecond"
        );
        let mut got = [0u8; 3];
        back.stream.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET", "the peek left the bytes to be read");
        // Parked again, it is handed back again at its next bytes; the
        // quiet one never is.
        park.park(back);
        client.write_all(b"PUT").await.expect("sent");
        assert_eq!(woke.recv().await.expect("woken").with, 2);
        assert!(woke.try_recv().is_err(), "the quiet socket was handed back");
    }

    #[tokio::test]
    async fn a_parked_socket_idle_for_the_timeout_is_closed_within_an_eighth_more() {
        let timeout = Duration::from_millis(400);
        let (park, mut woke, _stop, _parker) = started(timeout);
        let (server, mut client) = pair().await;
        let since = Instant::now();
        park.park(Parked {
            stream: server,
            since,
            with: 0,
        });
        assert!(closed_within(&mut client, Duration::from_secs(5)).await);
        let after = since.elapsed();
        assert!(
            after >= timeout && after < timeout + timeout / 8 + Duration::from_millis(100),
            "closed after {after:?}, the timeout is {timeout:?}"
        );
        assert!(woke.try_recv().is_err(), "a closed socket was handed back");
    }

    #[tokio::test]
    async fn the_drain_closes_every_parked_socket_and_ends_the_parker() {
        let (park, _woke, stop, parker) = started(Duration::from_secs(30));
        let mut clients = Vec::new();
        for with in 0..3 {
            let (server, client) = pair().await;
            park.park(Parked {
                stream: server,
                since: Instant::now(),
                with,
            });
            clients.push(client);
        }
        stop.send(true).expect("the parker listens");
        tokio::time::timeout(Duration::from_secs(5), parker)
            .await
            .expect("the parker ended")
            .expect("the parker did not panic");
        for client in &mut clients {
            assert!(closed_within(client, Duration::from_secs(1)).await);
        }
        // Parked after the drain: closed at once.
        let (server, mut client) = pair().await;
        park.park(Parked {
            stream: server,
            since: Instant::now(),
            with: 9,
        });
        assert!(closed_within(&mut client, Duration::from_secs(1)).await);
    }

    #[test]
    fn a_parked_socket_waits_in_little_more_than_its_handle() {
        // The listener parks a connection with its permit.
        let waiting = std::mem::size_of::<Waiting<tokio::sync::OwnedSemaphorePermit>>();
        let handle = std::mem::size_of::<TcpStream>();
        // `FuturesUnordered` keeps it as an `Option` in its node, beside
        // five links and two flags, in an `Arc`.
        let kept = std::mem::size_of::<Option<Waiting<tokio::sync::OwnedSemaphorePermit>>>();
        println!("a parked socket's wait: {waiting} bytes ({kept} kept); its handle: {handle}");
        assert!(
            waiting <= handle + 32,
            "a parked socket's wait is {waiting} bytes, its handle {handle}"
        );
    }
}
