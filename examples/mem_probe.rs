fn rss() -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .collect::<Vec<_>>()
        .join(" ")
}
fn main() {
    let p = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    println!("start {}", rss());
    let g = deltafin::source::gguf::GgufModel::open(&p).unwrap();
    println!("gguf {}", rss());
    let t = deltafin::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    println!("tok {}", rss());
    drop(g);
    println!("drop gguf {}", rss());
    drop(t);
    println!("drop tok {}", rss());
}
