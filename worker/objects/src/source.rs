//! An object's content as backup pieces (see the crate docs): tar headers and
//! member data apart, decompressed if it was uploaded as gzip, and hashed and
//! counted on the way for the object's record.

use std::io::{self, Read};
use std::sync::Arc;

use parking_lot::Mutex;

use revault_engine::{
    catalog, input_error,
    tar::{header_sum, pad},
    Error, Result, Source,
};

use crate::Encoding;

/// What the source saw, handed to the commit hook.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub(crate) size: u64,
    pub(crate) uploaded: u64,
    pub(crate) etag: String,
    pub(crate) tar_members: u64,
}

/// Counts bytes read from the network.
struct Counting<R> {
    inner: R,
    n: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n
            .fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(k)
    }
}

const BLOCK: usize = 512;

/// The data bytes (padding included) after a valid tar header, or `None`
/// when the block is not a tar header. Read with the `tar` crate's header
/// fields and checked as [`revault_engine::tar`] checks them.
fn tar_header(block: &[u8]) -> Option<u64> {
    let block: &[u8; BLOCK] = block.try_into().ok()?;
    if block.iter().all(|&b| b == 0) {
        return None;
    }
    let h = tar::Header::from_byte_slice(block);
    if h.cksum().ok()? != header_sum(block) {
        return None;
    }
    // Kinds of members whose size field counts the data blocks that follow.
    use tar::EntryType as T;
    let size = match h.entry_type() {
        T::Regular
        | T::Continuous
        | T::XHeader
        | T::XGlobalHeader
        | T::GNULongName
        | T::GNULongLink
        | T::GNUSparse => h.entry_size().ok()?,
        _ => 0,
    };
    size.checked_add(pad(size))
}

/// The piece being read.
enum Cur {
    /// A header block (in `head`).
    Head,
    /// Member data: this many bytes remain.
    Data(u64),
    /// Everything left (not a tar, or past its end), after `head`.
    Rest,
}

/// What the next piece is.
enum Next {
    /// A tar header, or the rest if the next block is not one.
    Header,
    /// Data of the member whose header was the last piece.
    Data(u64),
    /// Nothing: the content has ended.
    Done,
}

/// The object's content as backup pieces.
pub(crate) struct ObjectSource {
    name: String,
    r: Box<dyn Read + Send>,
    uploaded: Arc<std::sync::atomic::AtomicU64>,
    hasher: blake3::Hasher,
    size: u64,
    members: u64,
    cur: Cur,
    next: Next,
    /// Bytes read ahead that belong to the current piece.
    head: Vec<u8>,
    head_pos: usize,
    eof: bool,
    gzip: bool,
    out: Arc<Mutex<Option<Summary>>>,
}

impl ObjectSource {
    /// Reads `body`, uploaded with `encoding`; `out` gets the summary once
    /// the content has ended. `name` names the input in errors.
    pub(crate) fn new(
        name: String,
        body: Box<dyn Read + Send>,
        encoding: Encoding,
        out: Arc<Mutex<Option<Summary>>>,
    ) -> Self {
        let uploaded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Counting {
            inner: body,
            n: uploaded.clone(),
        };
        let r: Box<dyn Read + Send> = match encoding {
            Encoding::Identity => Box::new(counted),
            Encoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
        };
        ObjectSource {
            name,
            r,
            uploaded,
            hasher: blake3::Hasher::new(),
            size: 0,
            members: 0,
            cur: Cur::Rest,
            next: Next::Header,
            head: Vec::with_capacity(BLOCK),
            head_pos: 0,
            eof: false,
            gzip: encoding == Encoding::Gzip,
            out,
        }
    }

    fn err(&self, e: io::Error) -> Error {
        // What the gzip decoder reports for a corrupt or truncated stream (a
        // cancelled input is `Other`, so `input_error` still sees it).
        if self.gzip
            && matches!(
                e.kind(),
                io::ErrorKind::InvalidInput
                    | io::ErrorKind::InvalidData
                    | io::ErrorKind::UnexpectedEof
            )
        {
            return Error::BadGzip(e.to_string());
        }
        input_error(&self.name, e)
    }

    /// Reads from the content, hashing and counting it.
    fn raw_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.eof || buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.r.read(buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.size += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    fn fill_head(&mut self) -> Result<()> {
        self.head.clear();
        self.head_pos = 0;
        let mut block = [0u8; BLOCK];
        let mut got = 0;
        while got < BLOCK {
            let n = self.raw_read(&mut block[got..])?;
            if n == 0 {
                break;
            }
            got += n;
        }
        self.head.extend_from_slice(&block[..got]);
        Ok(())
    }

    fn finish_summary(&mut self) {
        *self.out.lock() = Some(Summary {
            size: self.size,
            uploaded: self.uploaded.load(std::sync::atomic::Ordering::Relaxed),
            etag: self.hasher.finalize().to_hex().to_string(),
            tar_members: self.members,
        });
    }
}

impl Source for ObjectSource {
    fn next_piece(&mut self) -> Result<bool> {
        // A backup reads every piece to its end before asking for the next.
        if let Next::Data(n) = self.next {
            self.next = Next::Header;
            if n > 0 {
                self.cur = Cur::Data(n);
                return Ok(true);
            }
        }
        if let Next::Done = self.next {
            self.finish_summary();
            return Ok(false);
        }
        self.fill_head()?;
        if self.head.is_empty() {
            self.next = Next::Done;
            self.finish_summary();
            return Ok(false);
        }
        match tar_header(&self.head) {
            Some(data) => {
                self.members += 1;
                self.cur = Cur::Head;
                self.next = Next::Data(data);
            }
            None => {
                self.cur = Cur::Rest;
                self.next = Next::Done;
            }
        }
        Ok(true)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.head_pos < self.head.len() {
            let n = (self.head.len() - self.head_pos).min(buf.len());
            buf[..n].copy_from_slice(&self.head[self.head_pos..self.head_pos + n]);
            self.head_pos += n;
            return Ok(n);
        }
        match self.cur {
            Cur::Head | Cur::Data(0) => Ok(0),
            Cur::Data(left) => {
                let k = left.min(buf.len() as u64) as usize;
                let n = self.raw_read(&mut buf[..k])?;
                // Zero: the archive ends inside a member; the next piece finds the end.
                self.cur = Cur::Data(left - n as u64);
                Ok(n)
            }
            Cur::Rest => self.raw_read(buf),
        }
    }

    fn finish(self: Box<Self>) -> Result<Option<Vec<catalog::Entry>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{gzip, pseudo_random, tarball};

    /// Reads a source the way the chunker does: piece by piece, to the end.
    fn pieces(content: &[u8], encoding: Encoding) -> (Vec<Vec<u8>>, Summary) {
        let out = Arc::new(Mutex::new(None));
        let mut src = ObjectSource::new(
            "test".into(),
            Box::new(io::Cursor::new(content.to_vec())),
            encoding,
            out.clone(),
        );
        let mut ps = Vec::new();
        while src.next_piece().unwrap() {
            let mut p = Vec::new();
            let mut buf = [0u8; 333];
            loop {
                let n = src.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                p.extend_from_slice(&buf[..n]);
            }
            ps.push(p);
        }
        let s = out.lock().clone().expect("summary at the end");
        (ps, s)
    }

    #[test]
    fn tar_content_is_split_at_members_and_stays_byte_exact() {
        let files = vec![
            (
                "resources/pods/namespaces/a/p1.json",
                pseudo_random(3000, 1),
            ),
            ("resources/pods/namespaces/a/empty.json", Vec::new()),
            ("metadata/version", b"1".to_vec()),
        ];
        let t = tarball(&files, 1_700_000_000);
        let (ps, s) = pieces(&t, Encoding::Identity);
        assert_eq!(ps.concat(), t, "pieces concatenate to the content");
        assert_eq!(s.size, t.len() as u64);
        assert_eq!(s.tar_members, 3);
        assert_eq!(s.etag, blake3::hash(&t).to_hex().to_string());
        // header, data, header (empty file: no data piece), header, data, end blocks
        let lens: Vec<usize> = ps.iter().map(Vec::len).collect();
        assert_eq!(lens[..5], [512, 3072, 512, 512, 512]);
        assert_eq!(lens.len(), 6, "{lens:?}");
        assert!(ps[5].iter().all(|&b| b == 0), "the end-of-archive blocks");
    }

    #[test]
    fn other_content_is_one_piece_and_gzip_is_decoded() {
        for data in [pseudo_random(10_000, 2), b"x".to_vec(), vec![0u8; 2048]] {
            let (ps, s) = pieces(&data, Encoding::Identity);
            assert_eq!(ps.len(), 1);
            assert_eq!(ps.concat(), data);
            assert_eq!(s.tar_members, 0);
            let gz = gzip(&data);
            let (ps, s) = pieces(&gz, Encoding::Gzip);
            assert_eq!(ps.concat(), data);
            assert_eq!(s.uploaded, gz.len() as u64);
            assert_eq!(s.size, data.len() as u64);
        }
        let (ps, s) = pieces(b"", Encoding::Identity);
        assert!(ps.is_empty());
        assert_eq!(s.size, 0);
    }

    #[test]
    fn a_truncated_tar_is_kept_as_it_is() {
        let t = tarball(&[("a", pseudo_random(5000, 3))], 1);
        let cut = &t[..2000];
        let (ps, _) = pieces(cut, Encoding::Identity);
        assert_eq!(ps.concat(), cut);
    }
}
