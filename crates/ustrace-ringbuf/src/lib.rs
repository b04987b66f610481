//! ustrace-ringbuf (skeleton; filled in by its owner).
