//! The stand-in answers to the CUDA driver's soname, `libcuda.so.1`: zero opens it by path
//! (`ZERO_CUDA_LIB`), and `cudarc`, which opens the driver by its usual names, then finds
//! the already-loaded library by that soname instead of searching for another one.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
