//! What a backup reads: a sequence of *pieces* of data. A byte stream is one
//! piece; a directory tree is one piece per regular file, so chunking restarts
//! at every file. Trees also produce a catalog of metadata.

pub mod tar;
pub mod tree;

use std::io::Read;

use crate::error::{Error, Result};
use crate::format::catalog;

pub trait Source: Send {
    /// Moves to the next piece; false when there are no more.
    fn next_piece(&mut self) -> Result<bool>;
    /// Reads from the current piece; `Ok(0)` once the piece has ended.
    fn read(&mut self, buf: &mut [u8]) -> Result<usize>;
    /// The catalog, for tree sources, once every piece has been read.
    fn finish(self: Box<Self>) -> Result<Option<Vec<catalog::Entry>>>;
}

/// A single byte stream: a file, stdin, a network body.
pub struct StreamSource<R> {
    name: String,
    reader: R,
    started: bool,
}

impl<R: Read + Send> StreamSource<R> {
    pub fn new(name: impl Into<String>, reader: R) -> Self {
        StreamSource {
            name: name.into(),
            reader,
            started: false,
        }
    }
}

impl<R: Read + Send> Source for StreamSource<R> {
    fn next_piece(&mut self) -> Result<bool> {
        Ok(!std::mem::replace(&mut self.started, true))
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.reader.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(input_error(&self.name, e)),
            }
        }
    }

    fn finish(self: Box<Self>) -> Result<Option<Vec<catalog::Entry>>> {
        Ok(None)
    }
}

/// An error reading a source's input `name`: a reader whose producer went
/// away ([`CancelledInput`]) cancels the backup; anything else is an I/O
/// error on the input. A [`Source`] written outside the engine maps its read
/// errors with this too, so a cancelled upload cancels its backup alike.
pub fn input_error(name: &str, e: std::io::Error) -> Error {
    if e.get_ref()
        .is_some_and(|inner| inner.is::<CancelledInput>())
    {
        return Error::Cancelled;
    }
    Error::Io {
        context: format!("reading {name}"),
        source: e,
    }
}

/// Marker error a reader returns when its producer went away (e.g. a client
/// disconnected mid-upload): the backup is discarded as cancelled.
#[derive(Debug)]
pub struct CancelledInput;

impl std::fmt::Display for CancelledInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("input cancelled")
    }
}

impl std::error::Error for CancelledInput {}
