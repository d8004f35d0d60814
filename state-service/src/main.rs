fn main() {
    eprintln!("kvroute-state: not yet wired");
    std::process::exit(2);
}
