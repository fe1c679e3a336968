// consumer.cc — the README's quick start as a user builds it against an installed hk: load a
// model with use_kernels (the installed embedded hub provides the kernels), generate, and say how
// many layers got a kernel. Usage: hk_consumer MODEL_DIR. Prints "kernels N" and "ids ...".
#include <hk/kernelize.h>
#include <hk/models.h>

#include <cstdint>
#include <exception>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hk_consumer MODEL_DIR\n";
    return 1;
  }
  try {
    hk::LoadOptions options;
    options.use_kernels = true;  // device-aware default mapping from the installed hub
    auto model = hk::AutoModelForCausalLM::from_pretrained(argv[1], options);
    auto out = model.eval().generate(std::vector<int64_t>{1, 2, 3}, {.max_new_tokens = 3});
    std::cout << "kernels " << model.kernelize_report()->num_kernels() << "\n";
    std::cout << "ids";
    for (int64_t id : out.sequences.at(0)) std::cout << " " << id;
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::cerr << "hk_consumer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
