// Reads input lines for interactive tools: with line editing and history (Debian's libedit,
// readline-compatible) when stdin is a terminal, plain std::getline otherwise (pipes, tests).
#ifndef LGPT_TOOLS_LINE_READER_H_
#define LGPT_TOOLS_LINE_READER_H_

#include <string>

namespace lgpt {

class LineReader {
 public:
  LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its newline; false at end of input. `prompt` is shown (on the
  // terminal) only in interactive mode.
  bool ReadLine(const std::string& prompt, std::string* line);

  // Adds a line to the history (arrow keys bring it back); no-op when not interactive.
  void AddHistory(const std::string& line);

  bool interactive() const { return interactive_; }

 private:
  bool interactive_;
};

}  // namespace lgpt

#endif  // LGPT_TOOLS_LINE_READER_H_
