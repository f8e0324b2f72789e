//! A file's bytes as copy-on-write blocks: an fsync keeps the file as it is
//! then by cloning the block list (cheap), and a later write copies only the
//! block it changes.

use std::io::Write;
use std::sync::Arc;

const BLOCK: usize = 64 << 10;

/// The bytes of a regular file. Blocks past the end are absent; an absent
/// block inside the file reads as zeros (a hole).
#[derive(Clone, Debug, Default)]
pub struct Content {
    size: u64,
    blocks: Vec<Option<Arc<Vec<u8>>>>,
}

fn blocks_for(size: u64) -> usize {
    size.div_ceil(BLOCK as u64) as usize
}

impl Content {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Up to `len` bytes from `offset` (fewer at the end of the file).
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let (b, o) = ((at / BLOCK as u64) as usize, (at % BLOCK as u64) as usize);
            let n = (BLOCK - o).min((end - at) as usize);
            match &self.blocks[b] {
                Some(block) => out.extend_from_slice(&block[o..o + n]),
                None => out.resize(out.len() + n, 0),
            }
            at += n as u64;
        }
        out
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        if end > self.size {
            self.set_len(end);
        }
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let (b, o) = ((at / BLOCK as u64) as usize, (at % BLOCK as u64) as usize);
            let n = (BLOCK - o).min(data.len() - done);
            let block = self.blocks[b].get_or_insert_with(|| Arc::new(vec![0; BLOCK]));
            Arc::make_mut(block)[o..o + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Truncates or extends (with zeros) to `size`.
    pub fn set_len(&mut self, size: u64) {
        if size < self.size {
            // Zero the tail of the last kept block, so that extending the file
            // again reads zeros there, not the old bytes.
            let tail = (size % BLOCK as u64) as usize;
            self.blocks.truncate(blocks_for(size));
            if tail != 0 {
                if let Some(Some(block)) = self.blocks.last_mut() {
                    Arc::make_mut(block)[tail..].fill(0);
                }
            }
        }
        self.blocks.resize(blocks_for(size), None);
        self.size = size;
    }

    /// Zeros `len` bytes from `offset` within the file (a punched hole).
    pub fn zero(&mut self, offset: u64, len: u64) {
        let end = self.size.min(offset.saturating_add(len));
        if end > offset {
            self.write(offset, &vec![0; (end - offset) as usize]);
        }
    }

    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let zeros = vec![0; BLOCK];
        for (i, block) in self.blocks.iter().enumerate() {
            let n = (self.size - (i * BLOCK) as u64).min(BLOCK as u64) as usize;
            w.write_all(&block.as_deref().unwrap_or(&zeros)[..n])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_truncates_and_keeps_snapshots_apart() {
        let mut c = Content::default();
        c.write(BLOCK as u64 - 2, b"abcd");
        assert_eq!(c.size(), BLOCK as u64 + 2);
        assert_eq!(c.read(0, 2), vec![0, 0], "a hole reads as zeros");
        assert_eq!(c.read(BLOCK as u64 - 2, 100), b"abcd");
        let snapshot = c.clone();
        c.write(BLOCK as u64 - 1, b"X");
        assert_eq!(snapshot.read(BLOCK as u64 - 2, 4), b"abcd");
        assert_eq!(c.read(BLOCK as u64 - 2, 4), b"aXcd");
        c.set_len(BLOCK as u64 - 1);
        c.set_len(BLOCK as u64 + 2);
        assert_eq!(c.read(BLOCK as u64 - 2, 4), b"a\0\0\0");
        c.zero(0, 1);
        let mut out = Vec::new();
        c.write_to(&mut out).unwrap();
        assert_eq!(out.len() as u64, c.size());
        assert_eq!(&out[BLOCK - 2..], b"a\0\0\0");
    }
}
