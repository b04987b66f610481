//! Fuzz the `hist` file reader of `ustrace hist`: any text must parse or fail with a line
//! number (no panic, bounded time), what parses must print back to text that parses, and
//! the charts, folded stacks and SVG of it must draw without panicking.
//! The reader and the pictures are modules of the `ustrace` binary, compiled here from
//! their files. Seeds: histogram.rst's outputs, e.g.
//! `mkdir -p seeds/hist_parse && cp ../crates/ustrace-cli/tests/golden/hist/input/*.hist seeds/hist_parse/`
//! then `RUSTC_BOOTSTRAP=1 cargo fuzz run hist_parse seeds/hist_parse -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/ustrace-cli/src/hist/chart.rs"]
mod chart;
#[allow(dead_code)]
#[path = "../../crates/ustrace-cli/src/hist/flame.rs"]
mod flame;
#[allow(dead_code)]
#[path = "../../crates/ustrace-cli/src/hist/parse.rs"]
mod parse;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(file) = parse::parse(&text) else {
        return;
    };
    // What is printed is the kernel's layout, which always reads again. (Exact round trips
    // of the kernel's layout are the property tests' job: garbage read tolerantly need not
    // print back to the same garbage.)
    parse::parse(&file.to_string()).expect("printed text reads again");
    for section in &file.sections {
        for merge in [false, true] {
            let opts = chart::Options {
                width: 20 + data.len() % 100,
                value: None,
                merge,
            };
            let _ = chart::draw(section, &opts);
        }
        let stacks = flame::folded(section, "hitcount");
        let _ = flame::folded_text(&stacks);
        let _ = flame::svg(&stacks, "fuzz", "hitcount");
    }
});
