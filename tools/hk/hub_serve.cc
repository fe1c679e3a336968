// `hk hub serve --root DIR [--host 127.0.0.1] [--port N]` — serve a hub tree over HTTP.
//
// Prints "serving DIR at http://HOST:PORT" on stdout once it listens (tests wait for that line),
// and stops cleanly on SIGINT/SIGTERM. --throttle limits file transfer speed (bytes/s) so
// interrupted downloads can be tested. --workers, --max-connections, --header-timeout and
// --idle-timeout set the connection limits that keep slow clients from stalling it
// (docs/security.md).
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <thread>

#include "commands.h"
#include "hk/error.h"
#include "hk/hub_server.h"

namespace hk::cli {
namespace {

void serve(const hub::HubServerOptions& options) {
  // Block the stop signals in every thread; one thread waits for them and stops the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  hub::HubServer server(options);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    server.stop();
  });
  std::cout << "serving " << options.root.string() << " at " << server.url() << std::endl;
  server.run();
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes sigwait when run() ended on its own
  waiter.join();
}

void add_hub(CLI::App& app) {
  auto* hub = app.add_subcommand("hub", "run a kernel hub");
  hub->require_subcommand(1);
  auto* serve_cmd = hub->add_subcommand("serve", "serve a hub directory over HTTP on loopback");
  static hub::HubServerOptions options;
  serve_cmd->add_option("--root", options.root, "hub directory to serve")->required();
  serve_cmd->add_option("--host", options.host, "address to listen on (default 127.0.0.1)");
  serve_cmd->add_option("--port", options.port, "port (default 0: chosen by the OS)");
  serve_cmd->add_option("--throttle", options.throttle_bytes_per_s,
                        "send files at most this many bytes per second (testing)");
  serve_cmd->add_option(
      "--require-token", options.require_token,
      "refuse requests without \"Authorization: Bearer TOKEN\" (clients: HF_TOKEN)");
  serve_cmd
      ->add_option("--workers", options.workers, "threads answering complete requests (default 16)")
      ->check(CLI::Range(1, 1024));
  serve_cmd
      ->add_option("--max-connections", options.max_connections,
                   "open connections at most; more are answered 503 (default 512)")
      ->check(CLI::Range(1, 100000));
  serve_cmd
      ->add_option("--header-timeout", options.header_timeout_s,
                   "seconds a client has to send a complete request header (default 10)")
      ->check(CLI::Range(1L, 3600L));
  serve_cmd
      ->add_option("--idle-timeout", options.idle_timeout_s,
                   "seconds an idle keep-alive connection stays open (default 5)")
      ->check(CLI::Range(1L, 3600L));
  serve_cmd->callback([] { serve(options); });
}

}  // namespace
}  // namespace hk::cli

HK_REGISTER_COMMAND(hub, hk::cli::add_hub);
