#include "core/base/output_dir.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;
using Files = std::map<std::string, std::string>;

std::string TempDir() {
  static int counter = 0;
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") /
                       absl::StrCat("output_dir_test_", ::getpid(), "_", ++counter);
  fs::create_directories(dir);
  return dir.string();
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Regular files under `dir` (relative names) with their contents.
Files Contents(const fs::path& dir) {
  Files files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), dir).string()] = Read(entry.path());
    }
  }
  return files;
}

void Populate(const fs::path& dir, const Files& files) {
  for (const auto& [name, text] : files) {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name, std::ios::binary) << text;
  }
}

// Entries beside `dir` that belong to a staging area.
int Leftovers(const fs::path& dir) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir.parent_path())) {
    if (entry.path().filename().string().find(".lgpt-") != std::string::npos) ++count;
  }
  return count;
}

TEST(OutputDirTest, NewDirectoryAppearsWhole) {
  const fs::path dir = fs::path(TempDir()) / "out" / "model";
  auto out = OutputDir::Begin(dir.string(), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*out)->WriteFile("model_config.yaml", "name: x\n").ok());
  std::ofstream((*out)->Path("lit_model.pth"), std::ios::binary) << "weights";
  EXPECT_FALSE(fs::exists(dir));  // nothing visible before Commit
  ASSERT_TRUE((*out)->Commit().ok());
  EXPECT_EQ(Contents(dir),
            (Files{{"lit_model.pth", "weights"}, {"model_config.yaml", "name: x\n"}}));
  EXPECT_EQ(Leftovers(dir), 0);
}

TEST(OutputDirTest, ExistingDirectoryKeepsOtherFilesAndDropsNamedOnes) {
  const fs::path dir = fs::path(TempDir()) / "ckpt";
  Populate(dir, {{"model_config.yaml", "old"},
                 {"model.safetensors", "stale weights"},
                 {"notes.txt", "keep me"},
                 {"logs/run1.txt", "keep me too"}});
  OutputDirOptions options;
  options.drop = {"model.safetensors"};
  auto out = OutputDir::Begin(dir.string(), {}, options);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*out)->WriteFile("model_config.yaml", "new").ok());
  ASSERT_TRUE((*out)->WriteFile("lit_model.pth", "merged").ok());
  ASSERT_TRUE((*out)->Commit().ok());
  EXPECT_EQ(Contents(dir), (Files{{"model_config.yaml", "new"},
                                  {"lit_model.pth", "merged"},
                                  {"notes.txt", "keep me"},
                                  {"logs/run1.txt", "keep me too"}}));
  EXPECT_EQ(Leftovers(dir), 0);
}

TEST(OutputDirTest, AbandonedOutputLeavesNothing) {
  const fs::path dir = fs::path(TempDir()) / "ckpt";
  Populate(dir, {{"a", "1"}});
  {
    auto out = OutputDir::Begin(dir.string(), {});
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*out)->WriteFile("a", "2").ok());
  }  // no Commit: an error path
  EXPECT_EQ(Contents(dir), (Files{{"a", "1"}}));
  EXPECT_EQ(Leftovers(dir), 0);
}

TEST(OutputDirTest, RefusesInputsFilesAndImpossibleParents) {
  const fs::path root = TempDir();
  Populate(root / "in", {{"model_config.yaml", "x"}});
  for (const fs::path& bad : {root / "in", root / "in" / "sub", root}) {
    auto out = OutputDir::Begin(bad.string(), {(root / "in").string()});
    ASSERT_FALSE(out.ok()) << bad;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  }
  // A directory of links to the input's files is the input too.
  fs::create_directories(root / "links");
  fs::create_symlink(root / "in" / "model_config.yaml", root / "links" / "model_config.yaml");
  EXPECT_FALSE(OutputDir::Begin((root / "links").string(), {(root / "in").string()}).ok());
  // The same directory through another spelling.
  auto dotted = OutputDir::Begin((root / "in" / ".").string(), {(root / "in").string()});
  EXPECT_FALSE(dotted.ok());
  Populate(root, {{"file", "x"}});
  EXPECT_FALSE(OutputDir::Begin((root / "file").string(), {}).ok());
  EXPECT_FALSE(OutputDir::Begin((root / "file" / "out").string(), {}).ok());
  EXPECT_EQ(Contents(root / "in"), (Files{{"model_config.yaml", "x"}}));
}

// The writer killed at random moments: the directory always holds the old files or the new
// ones, never a mix, and the next run clears what the killed one left.
TEST(OutputDirTest, KilledWriterLeavesOldOrNew) {
  const fs::path dir = fs::path(TempDir()) / "ckpt";
  Files old_files, new_files;
  for (int i = 0; i < 12; ++i) {
    old_files[absl::StrCat("f", i)] = std::string(64 << 10, static_cast<char>('a' + i));
    new_files[absl::StrCat("f", i)] = std::string(64 << 10, static_cast<char>('A' + i));
  }
  Populate(dir, old_files);
  auto write_all = [&] {
    auto out = OutputDir::Begin(dir.string(), {});
    if (!out.ok()) std::_Exit(2);
    for (const auto& [name, text] : new_files) {
      if (!(*out)->WriteFile(name, text).ok()) std::_Exit(3);
    }
    std::_Exit((*out)->Commit().ok() ? 0 : 4);
  };
  // How long one uncontested run takes, to spread the kills over it.
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) write_all();
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto run_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  ASSERT_EQ(Contents(dir), new_files);

  std::mt19937 rng(5);
  int saw_old = 0, saw_new = 0;
  for (int round = 0; round < 40; ++round) {
    fs::remove_all(dir);
    Populate(dir, old_files);
    pid = fork();
    if (pid == 0) write_all();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (run_us + 1)));
    ::kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    const Files seen = Contents(dir);
    ASSERT_TRUE(seen == old_files || seen == new_files) << "a mix after a kill in round " << round;
    (seen == old_files ? saw_old : saw_new)++;
    // The next run cleans up after the killed one.
    auto next = OutputDir::Begin(dir.string(), {});
    ASSERT_TRUE(next.ok()) << next.status();
    next->reset();
    EXPECT_EQ(Leftovers(dir), 0) << "round " << round;
  }
  EXPECT_GT(saw_old, 0);
}

TEST(WriteFileAtomicallyTest, ReplacesWholeAndLeavesNoPartial) {
  const fs::path dir = TempDir();
  const std::string path = (dir / "config.json").string();
  ASSERT_TRUE(WriteFileAtomically(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "two two").ok());
  EXPECT_EQ(Read(path), "two two");
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_FALSE(WriteFileAtomically((dir / "missing" / "x").string(), "x").ok());
}

// A rename over a device or pipe replaced the node with a regular file (--logits_out=
// /dev/stdout as root); both writers refuse it and leave no partial file.
TEST(WriteFileAtomicallyTest, RefusesToReplaceWhatIsNotARegularFile) {
  const fs::path dir = TempDir();
  const std::string fifo = (dir / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status written = WriteFileAtomically(fifo, "x");
  EXPECT_EQ(written.code(), absl::StatusCode::kFailedPrecondition) << written;
  EXPECT_NE(written.message().find("is not a regular file"), std::string::npos) << written;
  std::FILE* file = std::fopen((fifo + ".partial").c_str(), "wb");
  ASSERT_NE(file, nullptr);
  const absl::Status finished = FinishPartialFile(file, fifo + ".partial", fifo, true);
  EXPECT_EQ(finished.code(), absl::StatusCode::kFailedPrecondition) << finished;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_FALSE(fs::exists(fifo + ".partial"));
}

TEST(CheckOutputFileTest, RefusesFilesInsideTheInputs) {
  const fs::path root = TempDir();
  Populate(root / "in", {{"model.safetensors", "x"}});
  for (const fs::path& bad : {root / "in" / "model.safetensors", root / "in" / "new.npy",
                              root / "in" / "." / "sub" / "x.npy"}) {
    const absl::Status status = CheckOutputFile(bad.string(), {(root / "in").string()});
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << bad;
  }
  EXPECT_TRUE(CheckOutputFile((root / "logits.npy").string(), {(root / "in").string()}).ok());
  EXPECT_FALSE(CheckOutputFile("", {}).ok());
}

}  // namespace
}  // namespace lgpt
