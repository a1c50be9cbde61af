//! The bounded queue in front of a destination, and the thread that
//! empties it: see [`super`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

/// Bytes the queue holds before it drops lines: about 7,000 access-log
/// lines of 150 bytes, a few seconds of a busy gateway's log.
pub const QUEUE_BYTES: usize = 1 << 20;

/// How long the writer lets lines gather after the first of a batch: the
/// most a line waits in the queue when stderr keeps up.
pub const BATCH_DELAY: Duration = Duration::from_millis(10);

/// Lines dropped by the process's queue ([`stderr`]).
static DROPPED: OnceLock<Arc<Shared>> = OnceLock::new();

/// A writer into a bounded queue that a thread of its own empties into its
/// destination. Clones share the queue. Each `write` is one line (or
/// several, whole): appended whole, or dropped and counted when the queue
/// is full.
#[derive(Debug, Clone)]
pub struct Queue {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Signalled when a batch starts (the buffer was empty) and at close.
    pub(super) ready: Condvar,
    pub(super) dropped: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// The lines queued, whole.
    pub(super) buf: Vec<u8>,
    closed: bool,
}

pub(super) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes out what is queued when dropped (waiting at most a second), and
/// stops the writer thread.
#[derive(Debug)]
pub struct Flush {
    shared: Arc<Shared>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Drop for Flush {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.ready.notify_one();
        let _ = self.done.recv_timeout(Duration::from_secs(1));
    }
}

/// A queue in front of `out`, emptied by a thread named `tollgate-log`.
///
/// # Panics
/// When the thread cannot be started.
pub fn queue(out: impl std::io::Write + Send + 'static) -> (Queue, Flush) {
    let shared = Arc::new(Shared::default());
    let (done_tx, done) = std::sync::mpsc::channel();
    let worker = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("tollgate-log".into())
        .spawn(move || {
            drain(&worker, out);
            let _ = done_tx.send(());
        })
        .expect("the log writer thread starts");
    (
        Queue {
            shared: Arc::clone(&shared),
        },
        Flush { shared, done },
    )
}

/// The writer thread: waits for a batch's first line, lets the batch
/// gather, then writes it whole, until closed and empty.
fn drain(shared: &Shared, mut out: impl std::io::Write) {
    let mut batch = Vec::new();
    loop {
        let mut state = lock(&shared.state);
        while state.buf.is_empty() && !state.closed {
            state = shared
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if !state.closed {
            drop(state);
            std::thread::sleep(BATCH_DELAY);
            state = lock(&shared.state);
        }
        let closed = state.closed;
        std::mem::swap(&mut batch, &mut state.buf);
        drop(state);
        // A destination that fails (closed, full disk) loses the batch; the
        // gateway goes on.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if closed && lock(&shared.state).buf.is_empty() {
            return;
        }
    }
}

impl Queue {
    /// Lines this queue dropped because it was full, since start.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub(super) fn push(&self, line: &[u8]) {
        let mut state = lock(&self.shared.state);
        if state.buf.len() + line.len() > QUEUE_BYTES {
            drop(state);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let first = state.buf.is_empty();
        state.buf.extend_from_slice(line);
        drop(state);
        if first {
            self.shared.ready.notify_one();
        }
    }
}

impl std::io::Write for Queue {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(feature = "gateway")]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Queue {
    type Writer = Queue;

    fn make_writer(&'a self) -> Queue {
        self.clone()
    }
}

/// The process's queue in front of stderr, for the `tracing` subscriber
/// and the access log. Keep the [`Flush`] until exit.
pub fn stderr() -> (Queue, Flush) {
    let (writer, flush) = queue(std::io::stderr());
    let _ = DROPPED.set(Arc::clone(&writer.shared));
    (writer, flush)
}

/// Log lines the process's queue dropped because it was full, since start.
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |s| s.dropped.load(Ordering::Relaxed))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A destination that takes bytes only once `open` is set.
    #[derive(Clone, Default)]
    pub(in crate::logs) struct Gate {
        pub(in crate::logs) open: Arc<std::sync::atomic::AtomicBool>,
        pub(in crate::logs) out: Arc<Mutex<Vec<u8>>>,
    }

    impl std::io::Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_go_out_whole_and_in_order_and_a_full_queue_drops_and_counts() {
        let gate = Gate::default();
        let (q, flush) = queue(gate.clone());
        let line = [b'x'; 1023];
        let mut sent = 0;
        // The destination is shut: the writer holds at most one batch, the
        // queue fills, and the rest is dropped — never waited for.
        for i in 0..4 * QUEUE_BYTES / 1024 {
            let mut l = line.to_vec();
            l.extend_from_slice(format!("{i:08}\n").as_bytes());
            let before = q.dropped_lines();
            q.push(&l);
            if q.dropped_lines() == before {
                sent += 1;
            }
        }
        assert!(q.dropped_lines() > 0, "a full queue drops");
        gate.open.store(true, Ordering::SeqCst);
        drop(flush);
        let out = gate.out.lock().unwrap().clone();
        let lines: Vec<&[u8]> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), sent, "every queued line is written at exit");
        assert!(lines.iter().all(|l| l.len() == 1031), "whole lines only");
        let numbers: Vec<u64> = lines
            .iter()
            .map(|l| std::str::from_utf8(&l[1023..]).unwrap().parse().unwrap())
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "in order");
    }
}
