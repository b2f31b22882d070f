#include "tools/progress.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

std::string Contents(FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  return text;
}

TEST(ProgressTest, FormatsDurations) {
  EXPECT_EQ(Progress::FormatDuration(0), "0s");
  EXPECT_EQ(Progress::FormatDuration(42.4), "42s");
  EXPECT_EQ(Progress::FormatDuration(185), "3m05s");
  EXPECT_EQ(Progress::FormatDuration(3720), "1h02m");
}

TEST(ProgressTest, LineHasCountPercentAndEta) {
  Progress progress("train", 100, /*start=*/0, {nullptr, 0});
  // 10 units in 20 s: 90 more take 180 s.
  EXPECT_EQ(progress.Line(10, 20, "loss 3.1"),
            "train 10/100 (10.0%) 20s elapsed, eta 3m00s  loss 3.1");
  EXPECT_EQ(progress.Line(100, 200, ""), "train 100/100 (100.0%) 3m20s elapsed, done");
  // A resumed run: only this run's units count towards the speed.
  Progress resumed("train", 100, /*start=*/50, {nullptr, 0});
  EXPECT_EQ(resumed.Line(60, 20, ""), "train 60/100 (60.0%) 20s elapsed, eta 1m20s");
}

TEST(ProgressTest, NotATerminalPrintsFullLinesAtTheIntervalAndTheEnd) {
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressOptions options;
    options.out = file;
    options.terminal = 0;
    options.line_interval_s = 3600;  // nothing before the end
    Progress progress("rows", 1000, 0, options);
    for (int i = 1; i <= 1000; ++i) progress.Update(i);
    progress.Message("a result");
  }
  const std::string text = Contents(file);
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.rfind("rows 1000/1000 (100.0%) ", 0), 0u) << text;
  EXPECT_NE(text.find(", done\na result\n"), std::string::npos) << text;
  std::fclose(file);
}

TEST(ProgressTest, TerminalRewritesOneLineAndMessagesKeepIt) {
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressOptions options;
    options.out = file;
    options.terminal = 1;
    options.terminal_interval_s = 0;
    Progress progress("steps", 3, 0, options);
    progress.Update(1);
    progress.Message("val_loss 2.5");
    progress.Update(2);
    progress.Update(3);
  }
  const std::string text = Contents(file);
  EXPECT_EQ(text.rfind("\rsteps 1/3", 0), 0u) << text;
  EXPECT_NE(text.find("val_loss 2.5\nsteps 1/3"), std::string::npos) << text;
  EXPECT_NE(text.find("\rsteps 3/3 (100.0%)"), std::string::npos) << text;
  // One newline for the message, one at the end: the progress line is rewritten in place.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace lgpt
