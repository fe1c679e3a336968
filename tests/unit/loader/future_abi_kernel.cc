// Test library (not published): what a kernel built by a future hk with kernel ABI 2 looks like
// from here — it exports hk_kernel_library_v2 and no v1 symbol. The loader must say "ABI 2".
extern "C" __attribute__((visibility("default"))) const void* hk_kernel_library_v2(void) {
  return nullptr;
}
