//! The reader thread: the logs read on a thread of their own (gzip is
//! decompressed there), so that the replay thread, which must take lines
//! in order, only parses and decides. Lines go over in chunks, whose
//! buffers come back to be filled again, so that memory is allocated and
//! freed on one thread only.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, mpsc};

use super::input::Lines;
use super::options::SimError;

/// Lines read from one file, handed from the reader thread to the replay.
#[derive(Default)]
pub struct Chunk {
    /// The lines, one after the other.
    pub text: Vec<u8>,
    /// Where each line ends in `text`.
    pub ends: Vec<usize>,
    /// The file's index among the logs.
    pub file: usize,
    /// The number of the chunk's first line in its file.
    pub first_line: u64,
}

/// Lines per chunk.
const CHUNK_LINES: usize = 2048;
/// Chunks in flight between the threads (bounds the memory used).
const CHUNKS: usize = 8;

/// Starts reading `files`. Yields chunks of lines, or the read error that
/// ended the input; send used chunks back on the second channel. The
/// counter is the bytes read so far (the progress bar's position).
pub fn spawn(
    files: Vec<PathBuf>,
) -> (
    mpsc::Receiver<Result<Chunk, SimError>>,
    mpsc::SyncSender<Chunk>,
    Arc<AtomicU64>,
) {
    let (tx, rx) = mpsc::sync_channel(CHUNKS);
    let (give_back, returned) = mpsc::sync_channel::<Chunk>(CHUNKS + 2);
    let lines = Lines::new(files);
    let read = lines.read.clone();
    std::thread::spawn(move || fill(lines, &tx, &returned));
    (rx, give_back, read)
}

/// The thread's work: fills chunks and sends them until the input ends, a
/// file fails, or the replay stops listening.
fn fill(
    mut lines: Lines,
    tx: &mpsc::SyncSender<Result<Chunk, SimError>>,
    returned: &mpsc::Receiver<Chunk>,
) {
    let mut made = 0;
    let mut fresh = || -> Option<Chunk> {
        if made < CHUNKS + 1 {
            made += 1;
            return Some(Chunk::default());
        }
        returned.recv().ok()
    };
    let Some(mut chunk) = fresh() else { return };
    loop {
        let file = lines.index;
        let before = chunk.text.len();
        let more = match lines.append_next(&mut chunk.text) {
            Ok(more) => more,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        // A full chunk, the end, or a line from the next file: the
        // chunk goes, and the line just read starts the next one.
        let switched = more && !chunk.ends.is_empty() && lines.index != file;
        if switched || !more || chunk.ends.len() == CHUNK_LINES {
            let mut next = match fresh() {
                Some(c) => c,
                None => return,
            };
            next.text.clear();
            next.ends.clear();
            if more {
                next.text.extend_from_slice(&chunk.text[before..]);
                chunk.text.truncate(before);
            }
            if !chunk.ends.is_empty() && tx.send(Ok(chunk)).is_err() {
                return;
            }
            chunk = next;
            if !more {
                return;
            }
        }
        if chunk.ends.is_empty() {
            chunk.file = lines.index;
            chunk.first_line = lines.number;
        }
        chunk.ends.push(chunk.text.len());
    }
}
