//! The files: opened plain or through gzip, read line by line with their
//! file and line number, and the format their first line shows.

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
    let mut r = open(path, Arc::default())?;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| SimError::io(path.display(), e))?;
        if n == 0 || !buf.trim_ascii().is_empty() {
            return Ok(buf);
        }
    }
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

/// The lines of several files in turn, each with its file and number.
pub struct Lines {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, Box<dyn BufRead + Send>)>,
    /// 1-based number of the line last read, in its file.
    pub number: u64,
    /// Index in the list of files of the file now read.
    pub index: usize,
    /// Bytes read from the files so far (compressed, for gzip).
    pub read: Arc<AtomicU64>,
    /// Whether a file has been opened yet.
    current_seen: bool,
}

impl Lines {
    /// The lines of `files`, in order.
    pub fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files: files.into_iter(),
            current: None,
            number: 0,
            index: 0,
            read: Arc::default(),
            current_seen: false,
        }
    }

    /// The file now read.
    pub fn file(&self) -> Option<&Path> {
        self.current.as_ref().map(|(p, _)| p.as_path())
    }

    /// Reads the next line into `buf` (without its line ending); false at
    /// the end of the last file.
    ///
    /// # Errors
    /// A file cannot be opened or read (a truncated gzip stream too).
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, SimError> {
        buf.clear();
        self.append_next(buf)
    }

    /// Appends the next line to `buf` (without its line ending); false at
    /// the end of the last file.
    ///
    /// # Errors
    /// As [`Self::next_into`].
    pub fn append_next(&mut self, buf: &mut Vec<u8>) -> Result<bool, SimError> {
        let start = buf.len();
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.next() else {
                    return Ok(false);
                };
                let reader = open(&path, self.read.clone())?;
                if self.current_seen {
                    self.index += 1;
                }
                self.current_seen = true;
                self.current = Some((path, reader));
                self.number = 0;
            }
            let Some((path, reader)) = &mut self.current else {
                continue;
            };
            let n = reader
                .read_until(b'\n', buf)
                .map_err(|e| SimError::io(path.display(), e))?;
            if n == 0 {
                self.current = None;
                continue;
            }
            self.number += 1;
            while buf.len() > start && buf.last().is_some_and(|&c| c == b'\n' || c == b'\r') {
                buf.pop();
            }
            return Ok(true);
        }
    }
}
