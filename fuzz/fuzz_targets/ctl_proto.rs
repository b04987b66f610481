//! Fuzzes the control-socket decoder: whatever bytes arrive, decoding a frame or a request or
//! reply body must return (never panic, never allocate past the frame's limits), and anything
//! that decodes must encode back to a frame that decodes to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_ctl::proto::{read_frame, Reply, Request};

fuzz_target!(|data: &[u8]| {
    // The bytes as a stream of frames, as the server reads them.
    let mut stream = data;
    while let Ok(body) = read_frame(&mut stream) {
        check(&body);
    }
    // The bytes as one body.
    check(data);
});

fn check(body: &[u8]) {
    if let Ok(req) = Request::decode(body) {
        let frame = req.encode();
        let again = read_frame(&mut &frame[..]).expect("an encoded request is one frame");
        assert_eq!(
            Request::decode(&again).expect("an encoded request decodes"),
            req
        );
    }
    if let Ok(reply) = Reply::decode(body) {
        let frame = reply.encode();
        let again = read_frame(&mut &frame[..]).expect("an encoded reply is one frame");
        assert_eq!(
            Reply::decode(&again).expect("an encoded reply decodes"),
            reply
        );
    }
}
