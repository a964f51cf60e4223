/* A stand-in for the CUDA driver library with one entry point, for zero-sys'
 * driver_override test: each copy is compiled with its own FAKE_CUDA_VERSION, so the
 * version a process reads says which copy answered. CUresult 0 is CUDA_SUCCESS. */
int cuDriverGetVersion(int *version) {
    *version = FAKE_CUDA_VERSION;
    return 0;
}
