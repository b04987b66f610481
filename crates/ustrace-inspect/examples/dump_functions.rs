//! Prints this process's `available_filter_functions` text and how long
//! building the inventory took: `cargo run --release -p ustrace-inspect
//! --example dump_functions > /tmp/aff.txt`.

fn main() {
    let t = std::time::Instant::now();
    let inv = ustrace_inspect::symbols::build_inventory();
    let took = t.elapsed();
    print!("{}", inv.available_filter_functions());
    eprintln!(
        "{} functions from {} objects in {:?}",
        inv.functions().len(),
        inv.objects().len(),
        took
    );
}
