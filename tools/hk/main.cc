// hk — the command line. Each subcommand lives in its own file (commands.h registers them); this
// file only parses the top level and turns exceptions into exit status 1 with the message.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "hk/error.h"
#include "hk/version.h"

int main(int argc, char** argv) {
  CLI::App app{"hk — transformer runtime with hub-loaded, verified kernels"};
  app.set_version_flag("--version", std::string("hk ") + hk::version_string());
  app.require_subcommand(1);
  hk::cli::register_commands(app);
  // CLI11 would call an unknown command "an argument not expected" or say a subcommand is
  // required; name it and list the commands instead.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "hk: error: unknown command '" << argv[1] << "' (commands: " << names
                << "; see hk --help)\n";
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "hk: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
