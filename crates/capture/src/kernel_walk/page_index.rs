//! The page index placed after a binary's rows in the table. A search for an address's row
//! among a compiler's million rows takes 21 steps, most of them cache misses in a table of tens
//! of megabytes, on every frame of every walk, in the sampled thread's time; the index says
//! which rows cover each page of the binary's addresses, so the walk searches only those (a few
//! dozen rows, a few cache lines) after reading one entry.

use super::layout::Row;

/// The smallest page: 4 KiB of addresses.
const MIN_SHIFT: u32 = 12;

/// A binary's page index: how many entries, and how many address bits a page spans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PageIndex {
    /// Entries (pages from the first row's address to the last's).
    pub count: u32,
    /// Bits of a relative address below its page number.
    pub shift: u32,
}

impl PageIndex {
    /// The index for `rows` rows whose last address is `span` past the first: pages of 4 KiB,
    /// or larger where that would give more entries than a quarter of the rows (a binary with
    /// few rows over a wide range), so that the index takes at most 1/16 of the rows' room.
    pub fn for_rows(rows: u32, span: u32) -> PageIndex {
        let most = u64::from(rows / 4) + 1;
        let mut shift = MIN_SHIFT;
        while shift < 32 && (u64::from(span) >> shift) + 1 > most {
            shift += 1;
        }
        PageIndex {
            count: ((u64::from(span) >> shift) + 1) as u32,
            shift,
        }
    }

    /// Table slots the index takes: four entries a slot.
    pub fn slots(self) -> u32 {
        self.count.div_ceil(4)
    }

    /// Writes the index of `rows` (sorted by address, the first at 0) into `slots` (at least
    /// [`PageIndex::slots`] long): entry `p` is the first row at or past `p << shift`.
    pub fn write(self, rows: &[Row], slots: &mut [Row]) {
        let entries: &mut [u32] = bytemuck::cast_slice_mut(slots);
        let mut first = 0usize;
        for (page, entry) in entries.iter_mut().take(self.count as usize).enumerate() {
            let start = (page as u64) << self.shift;
            while first < rows.len() && u64::from(rows[first].pc) < start {
                first += 1;
            }
            *entry = first as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_at(pcs: &[u32]) -> Vec<Row> {
        pcs.iter()
            .map(|&pc| Row {
                pc,
                ..Row::default()
            })
            .collect()
    }

    /// The last row at or below `rel`, searched as the walk does: among the rows of its page.
    fn walk_search(index: PageIndex, rows: &[Row], entries: &[u32], rel: u64) -> Option<usize> {
        let page = rel >> index.shift;
        let (lo, hi) = if page >= u64::from(index.count) {
            (rows.len(), rows.len())
        } else {
            let hi = entries
                .get(page as usize + 1)
                .filter(|_| page + 1 < u64::from(index.count))
                .map_or(rows.len(), |&e| e as usize);
            (entries[page as usize] as usize, hi)
        };
        let found = lo + rows[lo..hi].partition_point(|r| u64::from(r.pc) <= rel);
        found.checked_sub(1)
    }

    #[test]
    fn a_search_among_a_pages_rows_finds_the_row_a_whole_search_finds() {
        // Dense rows, a gap of pages without rows, rows on a page boundary, several at one
        // address.
        let mut pcs: Vec<u32> = (0..3000).map(|i| i * 5).collect();
        pcs.extend([0x8000, 0x8000, 0x8ffc, 0x9000, 0x9001, 0x2_0000, 0x2_0100]);
        let rows = rows_at(&pcs);
        let span = *pcs.last().expect("rows");
        for index in [
            PageIndex::for_rows(rows.len() as u32, span),
            PageIndex {
                count: 1,
                shift: 32,
            },
        ] {
            let mut slots = vec![Row::default(); index.slots() as usize];
            index.write(&rows, &mut slots);
            let entries: &[u32] = bytemuck::cast_slice(&slots);
            for rel in (0..u64::from(span) + 0x3000)
                .step_by(3)
                .chain([0x8fff, 0x9000])
            {
                let whole = rows
                    .partition_point(|r| u64::from(r.pc) <= rel)
                    .checked_sub(1);
                assert_eq!(walk_search(index, &rows, entries, rel), whole, "{rel:#x}");
            }
        }
    }

    #[test]
    fn the_index_stays_small_for_few_rows_over_a_wide_range() {
        assert_eq!(
            PageIndex::for_rows(1_440_000, 100 << 20),
            PageIndex {
                count: 25_601,
                shift: 12
            }
        );
        let sparse = PageIndex::for_rows(100, u32::MAX);
        assert!(sparse.count <= 26 && sparse.slots() <= 7, "{sparse:?}");
        assert_eq!(PageIndex::for_rows(0, 0).count, 1);
    }
}
