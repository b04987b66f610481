//! The few protobuf encodings the Perfetto writer needs: varints, 64-bit doubles and
//! length-delimited fields (strings, bytes, nested messages).
//!
//! Written by hand rather than generated: the exporter writes a dozen fields of five
//! messages, and generating code for them would bring a protobuf compiler into every
//! build of the CLI. The test suite decodes the output with types generated from
//! Perfetto's own .proto files, so a wrong field number or wire type here fails there.

/// A message being encoded; nest one in another with [`Msg::message`].
#[derive(Debug, Default, Clone)]
pub struct Msg {
    buf: Vec<u8>,
}

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

impl Msg {
    /// An empty message.
    pub fn new() -> Msg {
        Msg::default()
    }

    fn key(&mut self, field: u32, wire: u32) {
        put_varint(&mut self.buf, u64::from(field << 3 | wire));
    }

    /// A `uint32`/`uint64`/enum field.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Msg {
        self.key(field, VARINT);
        put_varint(&mut self.buf, v);
        self
    }

    /// An `int32`/`int64` field: negative values take ten bytes, as protobuf sign-extends
    /// both to 64 bits.
    pub fn int(&mut self, field: u32, v: i64) -> &mut Msg {
        self.uint(field, v as u64)
    }

    /// A `double` field.
    pub fn double(&mut self, field: u32, v: f64) -> &mut Msg {
        self.key(field, FIXED64);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `bytes` field.
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Msg {
        self.key(field, LEN);
        put_varint(&mut self.buf, v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// A `string` field.
    pub fn str(&mut self, field: u32, v: &str) -> &mut Msg {
        self.bytes(field, v.as_bytes())
    }

    /// A nested message field.
    pub fn message(&mut self, field: u32, m: &Msg) -> &mut Msg {
        self.bytes(field, &m.buf)
    }

    /// The encoded message.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_protobuf_wire_format() {
        // The examples of the protobuf encoding guide: 150 in field 1, "testing" in 2.
        assert_eq!(Msg::new().uint(1, 150).as_bytes(), [0x08, 0x96, 0x01]);
        assert_eq!(
            Msg::new().str(2, "testing").as_bytes(),
            [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
        let mut neg = Msg::new();
        neg.int(1, -1);
        assert_eq!(neg.as_bytes().len(), 11);
        assert_eq!(neg.as_bytes()[10], 0x01);
        let mut d = Msg::new();
        d.double(5, 1.0);
        assert_eq!(d.as_bytes()[0], 5 << 3 | 1);
        assert_eq!(&d.as_bytes()[1..], 1.0f64.to_le_bytes());
        let mut outer = Msg::new();
        outer.message(3, Msg::new().uint(1, 1));
        assert_eq!(outer.as_bytes(), [0x1a, 0x02, 0x08, 0x01]);
        // Field numbers above 15 take a two-byte key.
        assert_eq!(Msg::new().uint(23, 0).as_bytes(), [0xb8, 0x01, 0x00]);
    }
}
