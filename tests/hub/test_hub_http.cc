// The hub end to end over real HTTP: `hk hub serve` on 127.0.0.1 (ephemeral port) serving a hub
// tree made by the test (synthetic repos with real digests, plus the test-only kernel repos the
// build publishes into <build>/test-hub). Covers version resolution, explain, interrupted and
// concurrent downloads, digests on load, trust, bad libraries, offline mode and the lockfile.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hub/http_client.h"
#include "hub_test_util.h"

namespace hk::hub {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string kNorm = "kernels-community/norm";
const std::string kBig = "kernels-community/big";
const std::string A = commit_id('a'), B = commit_id('b'), C = commit_id('c'), E = commit_id('e');

FakeVariant cpu_variant(unsigned seed) {
  FakeVariant v;
  v.files = {{"libfake.so", random_bytes(4096, seed)}, {"README.md", "a fake kernel\n"}};
  return v;
}

FakeVariant cuda_variant(unsigned seed) {
  FakeVariant v;
  v.variant = "hk1-cu130-x86_64-linux";
  v.backend_json = R"({"type": "cuda", "version": "13.0", "archs": ["90a"]})";
  v.files = {{"libfake.so", random_bytes(4096, seed)}};
  return v;
}

class HubHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    fs::path root = hub_root();
    // kernels-community/norm: 1.0.0 (a), 1.1.0 (b, branch v1), 2.0.0 (c, branch v2).
    for (auto [commit, version] :
         {std::pair{A, "1.0.0"}, std::pair{B, "1.1.0"}, std::pair{C, "2.0.0"}}) {
      write_variant(root, kNorm, commit, version, cpu_variant(commit[0]));
      write_variant(root, kNorm, commit, version, cuda_variant(commit[0] + 1));
      write_ref(root, kNorm, "tags", "v" + std::string(version), commit);
    }
    write_ref(root, kNorm, "tags", "nightly", C);  // not a version: ignored by ranges
    write_ref(root, kNorm, "heads", "v1", B);
    write_ref(root, kNorm, "heads", "v2", C);
    // kernels-community/big: one 3 MB file, for interrupted and concurrent downloads.
    FakeVariant big;
    big.files = {{"libbig.so", random_bytes(3 << 20, 7)}};
    big.library = "libbig.so";
    write_variant(root, kBig, E, "1.0.0", big);
    write_ref(root, kBig, "heads", "v1", E);
    write_ref(root, kBig, "tags", "v1.0.0", E);
    // The real test kernels (built .so files) published by the build.
    fs::path test_hub = binary_dir() / "test-hub";
    if (fs::is_directory(test_hub))
      fs::copy(test_hub, root, fs::copy_options::recursive | fs::copy_options::skip_existing);
    server_ = new ServerProcess(root);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tmp_;
  }

  static fs::path hub_root() { return tmp_->path() / "hub"; }
  static const std::string& url() { return server_->url(); }

  HubConfig config(const fs::path& cache) const {
    HubConfig c;
    c.endpoint = url();
    c.hub_dir = "/nonexistent-hub-dir";
    c.cache_dir = cache;
    c.progress = false;
    c.connect_timeout_s = 5;
    c.stall_timeout_s = 10;
    return c;
  }
  std::map<std::string, std::string> env(const fs::path& cache,
                                         const std::string& endpoint = "") const {
    return {{"HK_ENDPOINT", endpoint.empty() ? url() : endpoint},
            {"HK_KERNELS_CACHE", cache.string()},
            {"HK_HUB_DIR", "/nonexistent-hub-dir"},
            {"HF_HUB_OFFLINE", "<unset>"},
            {"HK_HUB_OFFLINE", "<unset>"},
            {"LOCAL_KERNELS", "<unset>"}};
  }
  static Target cpu() { return Target::for_device(Device::cpu()); }
  static bool have_test_hub() { return fs::is_directory(binary_dir() / "test-hub"); }

  TempDir cache_;
  static TempDir* tmp_;
  static ServerProcess* server_;
};
TempDir* HubHttp::tmp_ = nullptr;
ServerProcess* HubHttp::server_ = nullptr;

TEST_F(HubHttp, ServerListingsAndPathTraversal) {
  HttpClient http(url(), {});
  EXPECT_NE(http.get("/api/repos").find(kNorm), std::string::npos);
  EXPECT_NE(http.get("/api/" + kNorm + "/refs").find(B), std::string::npos);
  EXPECT_NE(http.get("/api/" + kNorm + "/" + A + "/variants").find("hk1-cpu-x86_64-linux"),
            std::string::npos);
  EXPECT_THROW(http.get("/api/" + kNorm + "/" + commit_id('f') + "/variants"), NotFound);
  EXPECT_THROW(http.get("/%2e%2e/%2e%2e/etc/passwd"), RuntimeFailure);
  EXPECT_THROW(http.get("/kernels-community/%2e%2e/%2e%2e/etc/passwd"), RuntimeFailure);
  EXPECT_THROW(http.get("/kernels-community/norm/refs/heads/v9"), NotFound);
}

TEST_F(HubHttp, TokenIsSentAsBearer) {
  ServerProcess private_hub(hub_root(), 0, "s3cret");
  HubConfig c = config(cache_.path());
  c.endpoint = private_hub.url();
  {
    Hub anonymous(c);
    std::string m = message_of([&] { anonymous.list_repos(); });
    EXPECT_NE(m.find("HTTP 401"), std::string::npos) << m;
    EXPECT_NE(m.find("HF_TOKEN"), std::string::npos) << m;
  }
  c.token = "s3cret";
  Hub with_token(c);
  EXPECT_EQ(with_token.resolve(kNorm, cpu()).commit, B);
  auto cli = run_hk({"kernels", "list"}, [&] {
    auto e = env(cache_.path(), private_hub.url());
    e["HF_TOKEN"] = "s3cret";
    return e;
  }());
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
}

TEST_F(HubHttp, VersionResolution) {
  Hub hub(config(cache_.path()));
  std::string rev;
  EXPECT_EQ(hub.resolve(kNorm, cpu()).commit, B);  // default: version 1 = branch v1
  ResolveOptions v2;
  v2.version = 2;
  EXPECT_EQ(hub.resolve(kNorm, cpu(), v2).commit, C);
  EXPECT_EQ(hub.resolve(kNorm + "@v1.0.0", cpu()).commit, A);             // tag
  EXPECT_EQ(hub.resolve(kNorm + "@v2", cpu()).commit, C);                 // branch
  EXPECT_EQ(hub.resolve(kNorm + "@" + A + ":RMSNorm", cpu()).commit, A);  // commit
  EXPECT_EQ(hub.resolve(kNorm + "@nightly", cpu()).commit, C);
  Resolution r = hub.resolve(kNorm + "@>=1.0,<2.0", cpu());
  EXPECT_EQ(r.commit, B);  // the highest match
  EXPECT_NE(r.revision.find("v1.1.0"), std::string::npos) << r.revision;
  EXPECT_EQ(hub.resolve(kNorm + "@>=1.0,!=1.1.0,<2", cpu()).commit, A);
  EXPECT_EQ(hub.resolve(kNorm + "@~=2.0", cpu()).commit, C);
  EXPECT_TRUE(fs::is_regular_file(r.dir / "libfake.so"));
  EXPECT_NO_THROW(hub.verify(r));

  std::string none = message_of([&] { hub.resolve(kNorm + "@>=3.0", cpu()); });
  EXPECT_NE(none.find("no version of kernel repo kernels-community/norm matches >=3.0"),
            std::string::npos)
      << none;
  EXPECT_NE(none.find("versions: 1.0.0, 1.1.0, 2.0.0"), std::string::npos) << none;
  std::string bad_rev = message_of([&] { hub.resolve(kNorm + "@v9.9.9", cpu()); });
  EXPECT_NE(bad_rev.find("branches: v1, v2"), std::string::npos) << bad_rev;
  EXPECT_NE(bad_rev.find("v1.0.0"), std::string::npos) << bad_rev;
  ResolveOptions v7;
  v7.version = 7;
  EXPECT_THROW(hub.resolve(kNorm, cpu(), v7), NotFound);
  EXPECT_THROW(hub.resolve("kernels-community/nope", cpu()), NotFound);

  std::vector<SemVer> versions = hub.versions(kNorm);
  ASSERT_EQ(versions.size(), 3u);
  EXPECT_EQ(versions.back(), (SemVer{2, 0, 0}));
}

TEST_F(HubHttp, ExplainPrintsEveryVariantWithItsReason) {
  auto r = run_hk({"kernels", "explain", kNorm + "@v1.1.0:RMSNorm", "--device", "cuda",
                   "--capability", "90", "--cuda-runtime", "13.0"},
                  env(cache_.path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("chosen    hk1-cu130-x86_64-linux: CUDA 13.0 ≤ runtime 13.0, arch matches sm_90"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rejected  hk1-cpu-x86_64-linux: a cpu build cannot run on a cuda device"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("commit  " + B), std::string::npos) << r.out;

  r = run_hk({"kernels", "explain", kNorm, "--device", "cuda", "--capability", "80",
              "--cuda-runtime", "12.4"},
             env(cache_.path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("rejected  hk1-cu130-x86_64-linux: built for CUDA 13.0, the runtime is CUDA 12.4"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("no variant fits"), std::string::npos) << r.out;

  r = run_hk({"kernels", "explain", kNorm + "@>=5"}, env(cache_.path()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("versions: 1.0.0, 1.1.0, 2.0.0"), std::string::npos) << r.err;
}

TEST_F(HubHttp, CliListInfoVersions) {
  auto r = run_hk({"kernels", "list"}, env(cache_.path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(kNorm), std::string::npos);
  r = run_hk({"kernels", "info", kNorm, "--json"}, env(cache_.path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"revision\": \"" + B + "\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"backend\": \"cuda\""), std::string::npos) << r.out;
  r = run_hk({"kernels", "versions", kNorm}, env(cache_.path()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2.0.0  cccccccccccc"), std::string::npos) << r.out;
  r = run_hk({"kernels", "info", "not a repo"}, env(cache_.path()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad kernel repo"), std::string::npos) << r.err;
}

fs::path write_project(const fs::path& dir, const std::string& repo) {
  write_file(dir / "hk-kernels.json", "{\"" + repo + "\": 1}");
  return dir;
}

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path());
  return out;
}

TEST_F(HubHttp, SigkillHalfWayLeavesNoFinalFileAndRerunCompletes) {
  TempDir project;
  write_project(project.path(), kBig);
  auto lock = run_hk({"kernels", "lock", project.path().string()}, env(cache_.path()));
  ASSERT_EQ(lock.exit_code, 0) << lock.err;

  // A server that sends 3 MB at 1 MB/s; kill the downloader once it has written some of it.
  ServerProcess slow(hub_root(), 1 << 20);
  fs::path repo_cache = cache_.path() / kBig;
  {
    Child child({hk_exe().string(), "kernels", "download", project.path().string()},
                env(cache_.path(), slow.url()));
    bool partial = false;
    for (int i = 0; i < 200 && !partial; ++i) {  // at most 10 s
      for (const auto& f : files_under(repo_cache / "tmp"))
        if (f.extension() == ".part" && fs::file_size(f) > 200 * 1024) partial = true;
      if (!partial) std::this_thread::sleep_for(50ms);
    }
    ASSERT_TRUE(partial) << "the download never got half-way";
    child.kill_now(SIGKILL);
    auto result = child.wait(5s);
    EXPECT_EQ(result.exit_code, -SIGKILL);
  }
  std::string sha = sha256_file(hub_root() / kBig / E / "build/hk1-cpu-x86_64-linux/libbig.so");
  fs::path variant = repo_cache / "snapshots" / E / "build/hk1-cpu-x86_64-linux";
  EXPECT_FALSE(fs::exists(repo_cache / "blobs" / sha));
  EXPECT_FALSE(fs::exists(variant / "libbig.so"));
  EXPECT_FALSE(fs::exists(variant / "metadata.json"));
  for (const auto& f : files_under(repo_cache))
    if (f.parent_path().filename() != "tmp") EXPECT_NE(f.extension(), ".so") << f;

  auto rerun = run_hk({"kernels", "download", project.path().string()}, env(cache_.path()));
  ASSERT_EQ(rerun.exit_code, 0) << rerun.err;
  EXPECT_EQ(sha256_file(repo_cache / "blobs" / sha), sha);
  EXPECT_EQ(sha256_file(variant / "libbig.so"), sha);
  EXPECT_TRUE(files_under(repo_cache / "tmp").empty());  // the dead process's .part is gone
}

TEST_F(HubHttp, EightProcessesFetchOneRepoAtOnce) {
  TempDir project;
  write_project(project.path(), kBig);
  ASSERT_EQ(run_hk({"kernels", "lock", project.path().string()}, env(cache_.path())).exit_code, 0);
  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < 8; ++i)
    children.push_back(std::make_unique<Child>(
        std::vector<std::string>{hk_exe().string(), "kernels", "download", project.path().string()},
        env(cache_.path())));
  for (auto& c : children) {
    auto r = c->wait(30s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("ok  " + kBig), std::string::npos) << r.out;
  }
  fs::path repo_cache = cache_.path() / kBig;
  auto blobs = files_under(repo_cache / "blobs");
  ASSERT_EQ(blobs.size(), 1u);  // one copy
  fs::path so = repo_cache / "snapshots" / E / "build/hk1-cpu-x86_64-linux/libbig.so";
  struct stat st {};
  ASSERT_EQ(stat(so.c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);  // the snapshot file is the blob, hard-linked
  EXPECT_EQ(sha256_file(so), blobs[0].filename().string());
  EXPECT_TRUE(files_under(repo_cache / "tmp").empty());
  Hub hub(config(cache_.path()));
  EXPECT_NO_THROW(hub.verify(hub.resolve(kBig, cpu())));
}

TEST_F(HubHttp, FlippedByteIsRefusedOnLoadAndByVerify) {
  Hub hub(config(cache_.path()));
  Resolution r = hub.resolve(kNorm + "@v1.0.0", cpu());
  fs::path so = r.dir / "libfake.so";
  std::string expected = r.metadata.sha256.at("libfake.so");
  std::string bytes = read_file(so);
  bytes[bytes.size() / 2] ^= 0x01;
  fs::permissions(so, fs::perms::owner_write, fs::perm_options::add);
  write_file(so, bytes);
  std::string actual = sha256_file(so);
  ASSERT_NE(actual, expected);
  try {
    hub.load(r);
    FAIL() << "a corrupt library was loaded";
  } catch (const IntegrityError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(so.string()), std::string::npos) << m;
    EXPECT_NE(m.find(expected), std::string::npos) << m;
    EXPECT_NE(m.find(actual), std::string::npos) << m;
  }
  auto v = run_hk({"kernels", "verify", kNorm + "@v1.0.0"}, env(cache_.path()));
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find("libfake.so"), std::string::npos) << v.err;
  EXPECT_NE(v.err.find(actual), std::string::npos) << v.err;
  auto good = run_hk({"kernels", "verify", kNorm + "@v2.0.0"}, env(cache_.path()));
  EXPECT_EQ(good.exit_code, 0) << good.err;
}

TEST_F(HubHttp, UntrustedOrgNeedsTrustRemoteCode) {
  ASSERT_TRUE(have_test_hub()) << "the build did not publish <build>/test-hub";
  Hub hub(config(cache_.path()));
  std::string refused = message_of([&] { hub.resolve("someone-else/rmsnorm", cpu()); });
  EXPECT_NE(refused.find("not from a trusted org"), std::string::npos) << refused;
  EXPECT_NE(refused.find("trust_remote_code"), std::string::npos) << refused;
  ResolveOptions trust;
  trust.trust_remote_code = true;
  Resolution r = hub.resolve("someone-else/rmsnorm", cpu(), trust);
  auto lib = hub.load(r);
  ASSERT_TRUE(lib);
  EXPECT_FALSE(lib->entries().empty());
  // The CLI says the same.
  auto cli = run_hk({"kernels", "verify", "someone-else/rmsnorm"}, env(cache_.path()));
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("--trust-remote-code"), std::string::npos) << cli.err;
}

TEST_F(HubHttp, BadLibrariesAreRefusedAndTheProcessLivesOn) {
  ASSERT_TRUE(have_test_hub()) << "the build did not publish <build>/test-hub";
  Hub hub(config(cache_.path()));
  // Wrong ABI major: selection rejects it with the reason ...
  std::string abi = message_of([&] { hub.resolve("kernels-community/wrong-abi", cpu()); });
  EXPECT_NE(abi.find("ABI 2"), std::string::npos) << abi;
  // ... and the loader refuses it too when selection is told to accept it.
  Target abi2 = cpu();
  abi2.abi_major = 2;
  Resolution wrong = hub.resolve("kernels-community/wrong-abi", abi2);
  std::string loader_abi = message_of([&] { hub.load(wrong); });
  EXPECT_NE(loader_abi.find("ABI"), std::string::npos) << loader_abi;

  Resolution unknown = hub.resolve("kernels-community/unknown-interface", cpu());
  std::string iface = message_of([&] { hub.load(unknown); });
  EXPECT_NE(iface.find("rms_norm"), std::string::npos) << iface;
  EXPECT_NE(iface.find("7"), std::string::npos) << iface;

  Resolution missing = hub.resolve("kernels-community/missing-symbol", cpu());
  std::string symbol = message_of([&] { hub.load(missing); });
  EXPECT_NE(symbol.find("hk_kernel_library_v1"), std::string::npos) << symbol;

  auto cli = run_hk({"kernels", "verify", "--load", "kernels-community/missing-symbol"},
                    env(cache_.path()));
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("hk_kernel_library_v1"), std::string::npos) << cli.err;

  // Still alive: a good kernel loads, and two versions of one repo coexist.
  auto v1 = hub.load(hub.resolve("kernels-community/rmsnorm@v1.0.0", cpu()));
  auto v2 = hub.load(hub.resolve("kernels-community/rmsnorm@v2.0.0", cpu()));
  ASSERT_TRUE(v1 && v2);
  EXPECT_NE(v1.get(), v2.get());
  EXPECT_NE(v1->path(), v2->path());
  EXPECT_EQ(hub.load(hub.resolve("kernels-community/rmsnorm@v1.0.0", cpu())).get(), v1.get());
}

TEST_F(HubHttp, ServerDownOfflineUsesTheCache) {
  TempDir root_copy;
  fs::copy(hub_root() / "kernels-community", root_copy.path() / "kernels-community",
           fs::copy_options::recursive);
  auto server = std::make_unique<ServerProcess>(root_copy.path());
  HubConfig online = config(cache_.path());
  online.endpoint = server->url();
  Resolution fetched;
  {
    Hub hub(online);
    fetched = hub.resolve(kNorm + "@>=1.0,<2.0", cpu());
  }
  server->stop();

  {
    Hub hub(online);
    std::string down = message_of([&] { hub.resolve(kNorm, cpu()); });
    EXPECT_NE(down.find("cannot reach hub at " + online.endpoint), std::string::npos) << down;
    EXPECT_NE(down.find("HF_HUB_OFFLINE=1"), std::string::npos) << down;
  }
  HubConfig offline = online;
  offline.offline = true;
  Hub hub(offline);
  Resolution r = hub.resolve(kNorm + "@>=1.0,<2.0", cpu());  // same rules, from the cache
  EXPECT_EQ(r.commit, fetched.commit);
  EXPECT_EQ(r.dir, fetched.dir);
  EXPECT_NO_THROW(hub.verify(r));
  EXPECT_EQ(hub.resolve(kNorm, cpu()).commit, B);  // branch v1 from the cached refs
  std::string not_cached = message_of([&] { hub.resolve(kNorm + "@v2.0.0", cpu()); });
  EXPECT_NE(not_cached.find("offline"), std::string::npos) << not_cached;

  TempDir empty;
  HubConfig no_cache = offline;
  no_cache.cache_dir = empty.path();
  Hub nothing(no_cache);
  std::string msg = message_of([&] { nothing.resolve(kNorm, cpu()); });
  EXPECT_NE(msg.find("offline mode"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has nothing for kernels-community/norm"), std::string::npos) << msg;
  auto cli = run_hk({"kernels", "verify", kNorm}, {{"HK_ENDPOINT", online.endpoint},
                                                   {"HK_KERNELS_CACHE", empty.path().string()},
                                                   {"HF_HUB_OFFLINE", "1"}});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("offline mode"), std::string::npos) << cli.err;
}

TEST_F(HubHttp, LockfileIsHonouredAndEnforced) {
  TempDir project;
  write_project(project.path(), kNorm);
  auto lock_run = run_hk({"kernels", "lock", project.path().string()}, env(cache_.path()));
  ASSERT_EQ(lock_run.exit_code, 0) << lock_run.err;
  Lockfile lock = load_lockfile(project.path() / "hk.lock");
  ASSERT_EQ(lock.repos.size(), 1u);
  EXPECT_EQ(lock.repos[0].commit, B);
  EXPECT_EQ(lock.repos[0].variants.size(), 2u);

  HubConfig c = config(cache_.path());
  c.lock = lock;
  c.lock->repos[0].commit = A;  // pin an older commit: resolution must follow the pin
  c.lock->repos[0].variants.clear();
  {
    Hub plain(config(cache_.path()));
    for (const auto& m : plain.variants(kNorm, A)) c.lock->repos[0].variants[m.variant] = m.sha256;
  }
  Hub pinned(c);
  Resolution r = pinned.resolve(kNorm, cpu());
  EXPECT_EQ(r.commit, A);
  EXPECT_EQ(r.revision, "hk.lock");
  EXPECT_NO_THROW(pinned.verify(r));
  EXPECT_THROW(pinned.resolve(kNorm + "@v2", cpu()), IntegrityError);  // contradicts the pin

  // A lock whose digest differs from the hub's files refuses the kernel.
  HubConfig tampered = c;
  tampered.lock->repos[0].variants["hk1-cpu-x86_64-linux"]["libfake.so"] = std::string(64, '0');
  Hub strict(tampered);
  std::string m = message_of([&] { strict.load(strict.resolve(kNorm, cpu())); });
  EXPECT_NE(m.find("hk.lock pins " + std::string(64, '0')), std::string::npos) << m;

  auto download = run_hk({"kernels", "download", project.path().string()}, env(cache_.path()));
  EXPECT_EQ(download.exit_code, 0) << download.err;
  EXPECT_NE(download.out.find("hk1-cu130-x86_64-linux"), std::string::npos) << download.out;
}

TEST_F(HubHttp, LocalPathsAndLocalKernelsOverride) {
  Hub hub(config(cache_.path()));
  fs::path variant_dir = hub_root() / kNorm / A / "build/hk1-cpu-x86_64-linux";
  Resolution r = hub.resolve(variant_dir.string() + ":RMSNorm", cpu());
  EXPECT_TRUE(r.local);
  EXPECT_EQ(r.dir, variant_dir);
  EXPECT_NO_THROW(hub.verify(r));
  EXPECT_THROW(hub.resolve(variant_dir.string() + ":Missing", cpu()), NotFound);

  HubConfig c = config(cache_.path());
  c.local_kernels[kNorm] = (hub_root() / kNorm / C).string();  // a repo build tree
  Hub overridden(c);
  Resolution o = overridden.resolve(kNorm + ":RMSNorm", cpu());
  EXPECT_TRUE(o.local);
  EXPECT_EQ(o.commit, C);
  EXPECT_EQ(o.dir, hub_root() / kNorm / C / "build/hk1-cpu-x86_64-linux");
}

}  // namespace
}  // namespace hk::hub
