//! Bodies that are small on the wire and huge inflated: gzip (gRPC's `grpc-encoding: gzip`,
//! HTTP's `Content-Encoding: gzip`) and zlib (HTTP's `deflate`) around a run of one byte, written
//! by hand (DEFLATE's fixed Huffman codes: a match of 258 bytes costs 13 bits, so a body inflates
//! about 160 times), with their checksums computed for the run without inflating it.

/// Bits, least significant first, as DEFLATE packs them.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    used: u32,
}

impl Bits {
    fn put(&mut self, value: u32, n: u32) {
        for i in 0..n {
            if self.used.is_multiple_of(8) {
                self.out.push(0);
            }
            let last = self.out.len() - 1;
            self.out[last] |= (((value >> i) & 1) as u8) << (self.used % 8);
            self.used += 1;
        }
    }

    /// A Huffman code: most significant bit first.
    fn code(&mut self, code: u32, n: u32) {
        for i in (0..n).rev() {
            self.put((code >> i) & 1, 1);
        }
    }

    fn literal(&mut self, byte: u8) {
        match byte {
            0..=143 => self.code(0b0011_0000 + u32::from(byte), 8),
            _ => self.code(0b1_1001_0000 + u32::from(byte) - 144, 9),
        }
    }
}

/// One final fixed-Huffman block: `prefix`, then `run` copies of `byte`, then `suffix`.
fn deflate(prefix: &[u8], byte: u8, run: usize, suffix: &[u8]) -> Vec<u8> {
    let mut bits = Bits::default();
    bits.put(1, 1);
    bits.put(1, 2);
    prefix.iter().for_each(|b| bits.literal(*b));
    let mut left = run;
    if left > 0 {
        bits.literal(byte);
        left -= 1;
    }
    while left >= 258 {
        // Length 258 (code 285), distance 1 (code 0): the last byte again, 258 times.
        bits.code(0b1100_0101, 8);
        bits.code(0, 5);
        left -= 258;
    }
    (0..left).for_each(|_| bits.literal(byte));
    suffix.iter().for_each(|b| bits.literal(*b));
    bits.code(0, 7);
    bits.out
}

fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    for (n, entry) in table.iter_mut().enumerate() {
        let mut c = n as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
        *entry = c;
    }
    table
}

/// A linear map of CRC registers, as the images of the 32 bits.
type Linear = [u32; 32];

fn apply(map: &Linear, v: u32) -> u32 {
    (0..32).filter(|i| v >> i & 1 == 1).fold(0, |acc, i| acc ^ map[i])
}

/// CRC-32 (gzip's) of `prefix`, `run` copies of `byte`, `suffix`. One byte's step is affine in
/// the register (`r -> L r + T[byte]`), so `run` steps are its power, by squaring.
fn crc32(prefix: &[u8], byte: u8, run: usize, suffix: &[u8]) -> u32 {
    let table = crc_table();
    let step = |r: u32, b: u8| table[((r ^ u32::from(b)) & 0xff) as usize] ^ (r >> 8);
    let mut r = prefix.iter().fold(!0u32, |r, b| step(r, *b));
    let linear: Linear = std::array::from_fn(|i| {
        let bit = 1u32 << i;
        table[(bit & 0xff) as usize] ^ (bit >> 8)
    });
    // (map, constant) for 2^k steps, and the result so far.
    let (mut map, mut constant) = (linear, table[usize::from(byte)]);
    let mut n = run;
    while n > 0 {
        if n & 1 == 1 {
            r = apply(&map, r) ^ constant;
        }
        let squared: Linear = std::array::from_fn(|i| apply(&map, map[i]));
        constant = apply(&map, constant) ^ constant;
        map = squared;
        n >>= 1;
    }
    !suffix.iter().fold(r, |r, b| step(r, *b))
}

fn adler32(prefix: &[u8], byte: u8, run: usize, suffix: &[u8]) -> u32 {
    const MOD: u128 = 65521;
    let (mut a, mut b) = (1u128, 0u128);
    let mut add = |byte: u8| {
        a = (a + u128::from(byte)) % MOD;
        b = (b + a) % MOD;
    };
    prefix.iter().for_each(|x| add(*x));
    let (k, v) = (run as u128, u128::from(byte));
    b = (b + k * a + v * (k * (k + 1) / 2 % MOD)) % MOD;
    a = (a + k * v) % MOD;
    suffix.iter().for_each(|x| {
        a = (a + u128::from(*x)) % MOD;
        b = (b + a) % MOD;
    });
    (b << 16 | a) as u32
}

/// gzip of `prefix`, `run` copies of `byte`, `suffix`.
pub fn gzip(prefix: &[u8], byte: u8, run: usize, suffix: &[u8]) -> Vec<u8> {
    let size = (prefix.len() + run + suffix.len()) as u32;
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.extend(deflate(prefix, byte, run, suffix));
    out.extend(crc32(prefix, byte, run, suffix).to_le_bytes());
    out.extend(size.to_le_bytes());
    out
}

/// zlib (HTTP's `deflate`) of the same.
pub fn zlib(prefix: &[u8], byte: u8, run: usize, suffix: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    out.extend(deflate(prefix, byte, run, suffix));
    out.extend(adler32(prefix, byte, run, suffix).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksums computed without the run are those of the whole, byte by byte.
    #[test]
    fn checksums_of_a_run_are_those_of_its_bytes() {
        let (prefix, suffix) = (b"{\"inputs\": \"".as_slice(), b"\"}".as_slice());
        for run in [0, 1, 2, 257, 258, 259, 1000, 70_000] {
            let whole = [prefix, &vec![b'a'; run], suffix].concat();
            let table = crc_table();
            let crc = !whole.iter().fold(!0u32, |r, b| table[((r ^ u32::from(*b)) & 0xff) as usize] ^ (r >> 8));
            assert_eq!(crc32(prefix, b'a', run, suffix), crc, "{run}");
            let (mut a, mut b) = (1u32, 0u32);
            for x in &whole {
                a = (a + u32::from(*x)) % 65521;
                b = (b + a) % 65521;
            }
            assert_eq!(adler32(prefix, b'a', run, suffix), b << 16 | a, "{run}");
        }
    }

    /// The deflate stream inflates to exactly what it stands for (checked with a minimal inflater
    /// of fixed-Huffman blocks).
    #[test]
    fn the_deflate_stream_is_the_run() {
        for run in [0, 1, 5, 258, 259, 517, 10_000] {
            let stream = deflate(b"head", b'a', run, b"tail");
            assert_eq!(inflate_fixed(&stream), [b"head".as_slice(), &vec![b'a'; run], b"tail"].concat(), "{run}");
        }
    }

    /// Enough of an inflater for what `deflate` writes: literals, length 258 at distance 1, end.
    fn inflate_fixed(stream: &[u8]) -> Vec<u8> {
        let mut at = 0usize;
        let mut bit = || {
            let b = (stream[at / 8] >> (at % 8)) & 1;
            at += 1;
            u32::from(b)
        };
        assert_eq!((bit(), bit() | bit() << 1), (1, 1), "a final fixed block");
        let mut out = Vec::new();
        loop {
            let mut code = 0;
            for _ in 0..7 {
                code = code << 1 | bit();
            }
            if code == 0 {
                return out;
            }
            code = code << 1 | bit();
            match code {
                0b0011_0000..=0b1011_1111 => out.push((code - 0b0011_0000) as u8),
                0b1100_0101 => {
                    let distance = (0..5).fold(0, |d, _| d << 1 | bit());
                    assert_eq!(distance, 0);
                    let last = *out.last().unwrap();
                    out.extend(std::iter::repeat_n(last, 258));
                }
                _ => {
                    code = code << 1 | bit();
                    out.push((code - 0b1_1001_0000 + 144) as u8);
                }
            }
        }
    }
}
