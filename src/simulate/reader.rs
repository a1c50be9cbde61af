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
    let read = Arc::<AtomicU64>::default();
    let counter = read.clone();
    std::thread::spawn(move || {
        if let Err(e) = fill(files, &counter, &tx, &returned) {
            let _ = tx.send(Err(e));
        }
    });
    (rx, give_back, read)
}

/// The thread's work: fills chunks, a file at a time, and sends them until
/// the input ends or the replay stops listening. A chunk holds the lines
/// of one file; the last of a file goes when the file ends.
///
/// # Errors
/// A file cannot be opened or read.
fn fill(
    files: Vec<PathBuf>,
    read: &Arc<AtomicU64>,
    tx: &mpsc::SyncSender<Result<Chunk, SimError>>,
    returned: &mpsc::Receiver<Chunk>,
) -> Result<(), SimError> {
    let mut made = 0;
    // A chunk to fill: a new one until there are enough in flight, then
    // one the replay gave back (none when it has stopped).
    let mut fresh = || -> Option<Chunk> {
        let mut chunk = if made < CHUNKS + 1 {
            made += 1;
            Chunk::default()
        } else {
            returned.recv().ok()?
        };
        chunk.text.clear();
        chunk.ends.clear();
        Some(chunk)
    };
    let Some(mut chunk) = fresh() else {
        return Ok(());
    };
    // Sends a chunk and takes the next; none when the replay has stopped.
    let mut pass = |chunk: Chunk| -> Option<Chunk> {
        tx.send(Ok(chunk)).ok()?;
        fresh()
    };
    for (file, path) in files.into_iter().enumerate() {
        let mut lines = Lines::open(path, read.clone())?;
        while lines.append_next(&mut chunk.text)? {
            if chunk.ends.is_empty() {
                chunk.file = file;
                chunk.first_line = lines.number;
            }
            chunk.ends.push(chunk.text.len());
            if chunk.ends.len() == CHUNK_LINES {
                let Some(next) = pass(chunk) else {
                    return Ok(());
                };
                chunk = next;
            }
        }
        if !chunk.ends.is_empty() {
            let Some(next) = pass(chunk) else {
                return Ok(());
            };
            chunk = next;
        }
    }
    Ok(())
}
