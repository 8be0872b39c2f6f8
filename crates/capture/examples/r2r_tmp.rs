fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let (mut total, mut methods, mut files, mut file_bytes) = (0usize, 0usize, 0, 0u64);
    let mut big = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "dll") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let Ok(img) = rootline_capture::jit::r2r::R2rImage::parse(&bytes) else {
            continue;
        };
        let h: usize = img.methods.capacity()
            * std::mem::size_of::<rootline_capture::jit::r2r::R2rMethod>()
            + img.methods.iter().map(|m| m.name.capacity()).sum::<usize>();
        total += h;
        methods += img.methods.len();
        files += 1;
        file_bytes += bytes.len() as u64;
        big.push((
            h,
            p.file_name().unwrap().to_string_lossy().to_string(),
            bytes.len(),
        ));
    }
    big.sort();
    big.reverse();
    println!("files {files} file bytes {file_bytes} methods {methods} heap {total}");
    for b in big.iter().take(5) {
        println!("{b:?}");
    }
}
