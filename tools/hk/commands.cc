// The command table filled by HK_REGISTER_COMMAND; subcommands are added in name order so the
// help text is stable.
#include "commands.h"

#include <map>
#include <string>

namespace hk::cli {
namespace {
std::map<std::string, CommandAdder>& table() {
  static std::map<std::string, CommandAdder> commands;
  return commands;
}
}  // namespace

bool register_command(const char* name, CommandAdder adder) {
  table()[name] = std::move(adder);
  return true;
}

void register_commands(CLI::App& app) {
  for (auto& [name, adder] : table()) adder(app);
}

}  // namespace hk::cli
