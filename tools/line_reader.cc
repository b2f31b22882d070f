#include "tools/line_reader.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

// After <cstdio>: libedit's readline.h uses FILE.
#include <editline/readline.h>

namespace lgpt {

LineReader::LineReader() : interactive_(::isatty(STDIN_FILENO) == 1) {
  if (interactive_) {
    // The prompt and editing go to stderr: stdout carries only the tool's output.
    rl_outstream = stderr;
    // Tab inserts itself: no completion of file names into messages.
    rl_bind_key('\t', rl_insert);
    using_history();
  }
}

bool LineReader::ReadLine(const std::string& prompt, std::string* line) {
  if (!interactive_) return static_cast<bool>(std::getline(std::cin, *line));
  char* input = readline(prompt.c_str());
  if (input == nullptr) {
    std::fprintf(stderr, "\n");  // end of input (Ctrl-D) leaves the prompt's line
    return false;
  }
  line->assign(input);
  std::free(input);
  return true;
}

void LineReader::AddHistory(const std::string& line) {
  if (interactive_ && !line.empty()) add_history(line.c_str());
}

}  // namespace lgpt
