//! Capping (Lillibridge et al., as described by Cao et al. FAST '19 §2.2): the
//! stream is cut into fixed segments of N containers' worth of data; in each,
//! old containers are ranked by how many of the segment's chunks they hold
//! (CNRC), and duplicates from containers ranked below the capping level T are
//! rewritten, so a segment reads at most T old containers.

use std::collections::HashMap;

use super::{cnrc, Item, Policy};

pub struct Capping {
    segment_bytes: u64,
    level: usize,
    buf: Vec<Item>,
    bytes: u64,
}

impl Capping {
    pub fn new(segment_bytes: u64, level: usize) -> Self {
        Capping {
            segment_bytes: segment_bytes.max(1),
            level,
            buf: Vec::new(),
            bytes: 0,
        }
    }

    fn decide(&mut self, out: &mut Vec<bool>) {
        let counts = cnrc(self.buf.iter());
        let mut ranked: Vec<(u64, u64)> = counts.into_iter().collect();
        // Highest count first; ties by container id so decisions are repeatable.
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let kept: HashMap<u64, ()> = ranked
            .iter()
            .take(self.level)
            .map(|(c, _)| (*c, ()))
            .collect();
        for it in self.buf.drain(..) {
            out.push(it.dup.is_some_and(|d| !kept.contains_key(&d.container)));
        }
        self.bytes = 0;
    }
}

impl Policy for Capping {
    fn push(&mut self, item: Item, out: &mut Vec<bool>) {
        self.bytes += u64::from(item.bytes);
        self.buf.push(item);
        if self.bytes >= self.segment_bytes {
            self.decide(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<bool>) {
        self.decide(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_containers_and_rewrites_below_the_level() {
        // One segment of 20 chunks (1 byte each): container 1 holds 8 of them,
        // container 2 holds 5, container 3 holds 3, container 4 holds 1;
        // 3 unique chunks. Capping level 2 keeps containers 1 and 2.
        let mut p = Capping::new(20, 2);
        let mut stream = Vec::new();
        for c in [1, 1, 2, 3, 1, 1, 4, 2, 2, 1, 3, 1, 2, 1, 3, 1, 2] {
            stream.push(Item::dup(1, 1, c, 0, 100));
        }
        stream.extend([Item::unique(1, 1); 3]);
        let mut out = Vec::new();
        for it in &stream {
            p.push(*it, &mut out);
        }
        p.finish(&mut out);
        let want: Vec<bool> = stream
            .iter()
            .map(|it| matches!(it.dup, Some(d) if d.container >= 3))
            .collect();
        assert_eq!(out, want);
        assert_eq!(
            out.iter().filter(|r| **r).count(),
            4,
            "three chunks of container 3 and one of 4"
        );
    }

    #[test]
    fn segments_are_decided_independently() {
        // Two 4-byte segments, level 1: each keeps its own best container.
        let mut p = Capping::new(4, 1);
        let s = [
            (1, 1),
            (1, 1),
            (1, 1),
            (2, 1),
            (2, 1),
            (2, 1),
            (2, 1),
            (1, 1),
        ];
        let mut out = Vec::new();
        for (c, b) in s {
            p.push(Item::dup(b, 1, c, 0, 10), &mut out);
        }
        p.finish(&mut out);
        assert_eq!(out, [false, false, false, true, false, false, false, true]);
    }
}
