//! The files: opened plain or through gzip, read line by line with their
//! line number, and the format their first line shows.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::read::MultiGzDecoder;

use crate::simulate::options::{InputFormat, SimError};

/// The format of the lines starting with `first` (the first non-empty
/// line): JSON that is a tollgate access-log event, other JSON, or the
/// combined format.
pub fn detect(first: &[u8]) -> InputFormat {
    let first = first.trim_ascii();
    if !first.starts_with(b"{") {
        return InputFormat::Combined;
    }
    let text = String::from_utf8_lossy(first);
    if text.contains("\"tollgate::access\"") || text.contains("\"fields\"") {
        InputFormat::Tollgate
    } else {
        InputFormat::Jsonl
    }
}

/// The first non-empty line of `path` (for [`detect`]).
///
/// # Errors
/// The file cannot be opened or read.
pub fn first_line(path: &Path) -> Result<Vec<u8>, SimError> {
    let mut lines = Lines::open(path.to_owned(), Arc::default())?;
    let mut buf = Vec::new();
    while lines.append_next(&mut buf)? && buf.trim_ascii().is_empty() {
        buf.clear();
    }
    Ok(buf)
}

/// Counts the bytes read from a file (the progress bar's position).
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn open(path: &Path, read: Arc<AtomicU64>) -> Result<Box<dyn BufRead + Send>, SimError> {
    let file = File::open(path).map_err(|e| SimError::io(path.display(), e))?;
    let counted = Counted { inner: file, read };
    let gz = path.extension().is_some_and(|e| e == "gz");
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 18,
            MultiGzDecoder::new(BufReader::with_capacity(1 << 16, counted)),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 18, counted))
    })
}

/// The lines of one file, numbered from 1.
pub struct Lines {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    /// 1-based number of the line last read.
    pub number: u64,
}

impl Lines {
    /// Opens `path`, counting the bytes it reads (compressed, for gzip)
    /// into `read`.
    ///
    /// # Errors
    /// The file cannot be opened.
    pub fn open(path: PathBuf, read: Arc<AtomicU64>) -> Result<Self, SimError> {
        let reader = open(&path, read)?;
        Ok(Self {
            path,
            reader,
            number: 0,
        })
    }

    /// Appends the next line to `buf` (without its line ending); false at
    /// the end of the file.
    ///
    /// # Errors
    /// The file cannot be read (a truncated gzip stream too).
    pub fn append_next(&mut self, buf: &mut Vec<u8>) -> Result<bool, SimError> {
        let start = buf.len();
        let n = self
            .reader
            .read_until(b'\n', buf)
            .map_err(|e| SimError::io(self.path.display(), e))?;
        if n == 0 {
            return Ok(false);
        }
        self.number += 1;
        while buf.len() > start && buf.last().is_some_and(|&c| c == b'\n' || c == b'\r') {
            buf.pop();
        }
        Ok(true)
    }
}
