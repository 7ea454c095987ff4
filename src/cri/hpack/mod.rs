//! A shadow HPACK decoder (RFC 7541): reads the header blocks two peers
//! exchange, keeping the dynamic table in step with theirs.
//!
//! Why our own: the HPACK crates on crates.io that decode (loona-hpack,
//! fluke-hpack, hpack) rebuild a 257-entry hash map of the Huffman code
//! for every Huffman string and then look each bit up in it; with the
//! grpc-go and h2 encoders (every call sends a fresh `grpc-timeout`
//! literal) that was about a tenth of the relay's CPU. This decoder is
//! lenient where a receiving peer decides (no table size ceiling of its
//! own, size updates anywhere): a block the peer refuses ends that
//! connection, so only blocks the peer accepts need reading right. It is
//! checked against loona-hpack on random and encoded blocks (tests, fuzz
//! target `header_block`).

mod huffman;

use std::collections::VecDeque;

use bytes::{BufMut, BytesMut};

pub use huffman::HuffmanError;

/// The dynamic table's size before any size update (RFC 7540 §6.5.2).
const INITIAL_TABLE_SIZE: usize = 4096;
/// Per-entry overhead counted in table sizes (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Why a header block could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The block ends inside a field.
    Truncated,
    /// An integer longer than any size criguard can hold.
    IntegerOverflow,
    /// Index 0, or past the end of the static and dynamic tables.
    BadIndex(usize),
    /// A Huffman string that is not valid.
    Huffman(HuffmanError),
}

/// One dynamic table entry: name and value in one allocation.
#[derive(Debug)]
struct Entry {
    bytes: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.bytes[..self.name_len]
    }
    fn value(&self) -> &[u8] {
        &self.bytes[self.name_len..]
    }
    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

/// The decoding context of one direction of a connection.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: dynamic index 62 is `table[0]`.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// Scratch space for Huffman-decoded names and values.
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a decoded string lies.
#[derive(Clone, Copy)]
enum Str {
    /// In the block, at this range.
    Block(usize, usize),
    /// In the scratch buffer.
    Scratch,
    /// The name of table index `i`.
    Indexed(usize),
}

impl Decoder {
    /// A context with an empty dynamic table of the initial size.
    pub fn new() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: INITIAL_TABLE_SIZE,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
        }
    }

    /// Reads a whole header block, calling `field(name, value)` for each
    /// field in order. On error the context is unusable (so is the
    /// peer's: a decoding error ends an HTTP/2 connection).
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let mut pos = 0;
        while pos < block.len() {
            let first = block[pos];
            if first & 0x80 != 0 {
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.get(index)?;
                field(name, value);
            } else if first & 0xe0 == 0x20 {
                let size = integer(block, &mut pos, 5)?;
                self.max_size = size;
                self.evict_to(size);
            } else {
                // Literal: with incremental indexing (01), or without
                // (0000) / never (0001) indexed.
                let indexing = first & 0x40 != 0;
                let index = integer(block, &mut pos, if indexing { 6 } else { 4 })?;
                let name = if index == 0 {
                    self.name_buf.clear();
                    string(block, &mut pos, &mut self.name_buf)?
                } else {
                    self.get(index)?;
                    Str::Indexed(index)
                };
                self.value_buf.clear();
                let value = string(block, &mut pos, &mut self.value_buf)?;
                let name = self.resolve(block, name, true);
                let value = self.resolve(block, value, false);
                field(name, value);
                if indexing {
                    let mut bytes = Vec::with_capacity(name.len() + value.len());
                    bytes.extend_from_slice(name);
                    bytes.extend_from_slice(value);
                    let name_len = name.len();
                    self.insert(Entry {
                        bytes: bytes.into_boxed_slice(),
                        name_len,
                    });
                }
            }
        }
        Ok(())
    }

    fn resolve<'a>(&'a self, block: &'a [u8], s: Str, is_name: bool) -> &'a [u8] {
        match s {
            Str::Block(from, to) => &block[from..to],
            Str::Scratch if is_name => &self.name_buf,
            Str::Scratch => &self.value_buf,
            // Checked by `get` before.
            Str::Indexed(i) => self.get(i).map(|(n, _)| n).unwrap_or_default(),
        }
    }

    /// The field at `index` (1-based: the static table, then the dynamic
    /// one, newest first).
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex(0)),
            1..=61 => Ok(STATIC[index - 1]),
            _ => self
                .table
                .get(index - 62)
                .map(|e| (e.name(), e.value()))
                .ok_or(DecodeError::BadIndex(index)),
        }
    }

    fn insert(&mut self, entry: Entry) {
        let size = entry.size();
        if size > self.max_size {
            // An entry larger than the table empties it (RFC 7541 §4.4).
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.table.push_front(entry);
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some(old) = self.table.pop_back() else {
                break;
            };
            self.size -= old.size();
        }
    }

    /// Entries in the dynamic table.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }
}

/// Reads an integer with an `n`-bit prefix at `pos` (RFC 7541 §5.1).
fn integer(block: &[u8], pos: &mut usize, n: u32) -> Result<usize, DecodeError> {
    let mask = (1usize << n) - 1;
    let mut value = usize::from(*block.get(*pos).ok_or(DecodeError::Truncated)?) & mask;
    *pos += 1;
    if value < mask {
        return Ok(value);
    }
    let mut shift = 0u32;
    loop {
        let b = *block.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift > 28 {
            return Err(DecodeError::IntegerOverflow);
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// Writes an HPACK integer with an `n`-bit prefix under the high bits
/// `high` (RFC 7541 §5.1), the encoder beside [`integer`].
pub(crate) fn encode_integer(out: &mut BytesMut, n: u8, high: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.put_u8(high | v as u8);
    } else {
        out.put_u8(high | max as u8);
        v -= max;
        while v >= 128 {
            out.put_u8((v % 128 + 128) as u8);
            v /= 128;
        }
        out.put_u8(v as u8);
    }
}

/// Reads a string literal at `pos` (RFC 7541 §5.2); a Huffman one is
/// decoded into `scratch`.
fn string(block: &[u8], pos: &mut usize, scratch: &mut Vec<u8>) -> Result<Str, DecodeError> {
    let huffman = *block.get(*pos).ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(block, pos, 7)?;
    let from = *pos;
    let to = from.checked_add(len).filter(|&to| to <= block.len());
    let to = to.ok_or(DecodeError::Truncated)?;
    *pos = to;
    if huffman {
        huffman::decode(&block[from..to], scratch).map_err(DecodeError::Huffman)?;
        Ok(Str::Scratch)
    } else {
        Ok(Str::Block(from, to))
    }
}

/// RFC 7541 Appendix A.
static STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn decoded(d: &mut Decoder, block: &[u8]) -> Result<Fields, DecodeError> {
        let mut out = Vec::new();
        d.decode(block, |n, v| out.push((n.to_vec(), v.to_vec())))?;
        Ok(out)
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(f: &[(&str, &str)]) -> Fields {
        f.iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn the_rfc_request_examples_with_huffman() {
        // RFC 7541 C.4: three requests on one connection.
        let mut d = Decoder::new();
        let first = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        let base = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(decoded(&mut d, &first).unwrap(), fields(&base));
        assert_eq!(d.size, 57);
        let second = hex("8286 84be 5886 a8eb 1064 9cbf");
        let mut want = base.to_vec();
        want.push(("cache-control", "no-cache"));
        assert_eq!(decoded(&mut d, &second).unwrap(), fields(&want));
        let third = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
        let want = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ];
        assert_eq!(decoded(&mut d, &third).unwrap(), fields(&want));
        assert_eq!((d.table_len(), d.size), (3, 164));
    }

    #[test]
    fn the_rfc_response_examples_evict_in_a_256_byte_table() {
        // RFC 7541 C.6, the table limited to 256 bytes by a size update.
        let mut d = Decoder::new();
        let mut first = hex("3fe1 01");
        first.extend(hex(
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        ));
        let date = "Mon, 21 Oct 2013 20:13:21 GMT";
        let loc = "https://www.example.com";
        let want = [
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date),
            ("location", loc),
        ];
        assert_eq!(decoded(&mut d, &first).unwrap(), fields(&want));
        assert_eq!(d.size, 222);
        let second = hex("4883 640e ffc1 c0bf");
        let want = [
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date),
            ("location", loc),
        ];
        assert_eq!(decoded(&mut d, &second).unwrap(), fields(&want));
        assert_eq!((d.table_len(), d.size), (4, 222), ":status 302 evicted");
    }

    #[test]
    fn bad_blocks_are_errors_not_panics() {
        let mut d = Decoder::new();
        assert_eq!(decoded(&mut d, &[0x80]), Err(DecodeError::BadIndex(0)));
        assert_eq!(decoded(&mut d, &[0xbe]), Err(DecodeError::BadIndex(62)));
        assert_eq!(
            decoded(&mut d, &[0x40, 0x05, b'a']),
            Err(DecodeError::Truncated)
        );
        assert_eq!(decoded(&mut d, &[0xff, 0xff]), Err(DecodeError::Truncated));
        let long = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(decoded(&mut d, &long), Err(DecodeError::IntegerOverflow));
    }

    /// A Huffman encoding, for the tests' own blocks.
    fn huffman(s: &[u8]) -> Vec<u8> {
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for &b in s {
            let (code, len) = huffman::code_of(b);
            acc = (acc << len) | u64::from(code);
            bits += len;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
        }
        out
    }

    /// One field representation, as an encoder may choose it.
    #[derive(Debug, Clone)]
    enum Rep {
        Indexed(usize),
        Literal {
            mode: u8,
            name_index: Option<usize>,
            name: Vec<u8>,
            value: Vec<u8>,
            huff: bool,
        },
        SizeUpdate(usize),
    }

    fn int(out: &mut Vec<u8>, n: u8, high: u8, v: usize) {
        let mut b = bytes::BytesMut::new();
        super::encode_integer(&mut b, n, high, v);
        out.extend_from_slice(&b);
    }

    fn str(out: &mut Vec<u8>, s: &[u8], huff: bool) {
        if huff {
            let h = huffman(s);
            int(out, 7, 0x80, h.len());
            out.extend(h);
        } else {
            int(out, 7, 0, s.len());
            out.extend_from_slice(s);
        }
    }

    fn encode(reps: &[Rep]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in reps {
            match r {
                Rep::Indexed(i) => int(&mut out, 7, 0x80, *i),
                Rep::SizeUpdate(s) => int(&mut out, 5, 0x20, *s),
                Rep::Literal {
                    mode,
                    name_index,
                    name,
                    value,
                    huff,
                } => {
                    let (n, high) = match mode % 3 {
                        0 => (6, 0x40),
                        1 => (4, 0x00),
                        _ => (4, 0x10),
                    };
                    int(&mut out, n, high, name_index.unwrap_or(0));
                    if name_index.is_none() {
                        str(&mut out, name, *huff);
                    }
                    str(&mut out, value, *huff);
                }
            }
        }
        out
    }

    fn rep() -> impl Strategy<Value = Rep> {
        let text = proptest::collection::vec(any::<u8>(), 0..40);
        prop_oneof![
            4 => (1usize..70).prop_map(Rep::Indexed),
            6 => (any::<u8>(), proptest::option::of(1usize..70), text.clone(), text, any::<bool>())
                .prop_map(|(mode, name_index, name, value, huff)| Rep::Literal {
                    mode, name_index, name, value, huff
                }),
            1 => (0usize..300).prop_map(Rep::SizeUpdate),
        ]
    }

    proptest! {
        /// Whatever loona-hpack accepts, this decoder reads the same, block
        /// after block on one context.
        #[test]
        fn reads_what_loona_hpack_reads(blocks in proptest::collection::vec(
            proptest::collection::vec(rep(), 1..12), 1..6)
        ) {
            let mut ours = Decoder::new();
            let mut theirs = loona_hpack::Decoder::new();
            for reps in &blocks {
                let block = encode(reps);
                let Ok(want) = theirs.decode(&block) else { break };
                prop_assert_eq!(decoded(&mut ours, &block).unwrap(), want);
            }
        }

        /// The same on arbitrary bytes.
        #[test]
        fn arbitrary_bytes_read_like_loona_hpack(blocks in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..64), 1..4)
        ) {
            let mut ours = Decoder::new();
            let mut theirs = loona_hpack::Decoder::new();
            for block in &blocks {
                let Ok(want) = theirs.decode(block) else { break };
                prop_assert_eq!(decoded(&mut ours, block).unwrap(), want);
            }
        }
    }
}
