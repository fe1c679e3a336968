// Test repo: a shared object that exports no hk_kernel_library_v1 (as if built without the SDK).
// The loader must refuse it naming the file and the missing symbol.
extern "C" __attribute__((visibility("default"))) int not_an_hk_kernel(void) {
  return 42;
}
