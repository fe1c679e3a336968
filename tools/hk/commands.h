// Registration of the `hk` subcommands. Each subcommand lives in its own file and registers itself
// with a static HK_REGISTER_COMMAND(name, fn) so that adding a command touches no shared file.
// The function adds a CLI11 subcommand whose callback does the work and throws hk::Error on
// user-facing failures (main turns those into exit status 1 and the message on stderr).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace hk::cli {

using CommandAdder = std::function<void(CLI::App& app)>;
bool register_command(const char* name, CommandAdder adder);
void register_commands(CLI::App& app);

}  // namespace hk::cli

#define HK_REGISTER_COMMAND(name, fn) \
  static const bool hk_registered_##name = ::hk::cli::register_command(#name, fn)
