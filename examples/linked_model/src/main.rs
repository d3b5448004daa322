//! `linked-model PROGRAM.pte INPUT.f32`: runs the program's `forward` with linked weights and
//! prints the output.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pte, input] = args.as_slice() else {
        eprintln!("usage: linked-model PROGRAM.pte INPUT.f32");
        std::process::exit(2);
    };
    let run = || -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        let backend = xnnblob::backend::Backend::with_defaults()?;
        let program = linked_model::load(&backend, std::path::Path::new(pte))?;
        let bytes = std::fs::read(input)?;
        let x: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut m = program.method("forward")?;
        Ok(m.execute_f32(&[&x])?.remove(0))
    };
    match run() {
        Ok(out) => println!("{out:?}"),
        Err(e) => {
            eprintln!("linked-model: {e}");
            std::process::exit(1);
        }
    }
}
