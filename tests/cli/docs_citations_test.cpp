// The docs name the tests that prove each guarantee ("proved by") and the
// files that implement it. A test renamed or a file moved leaves a citation
// that proves nothing; these checks fail on it, naming the doc and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../cli_run.h"

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = K3PACK_SOURCE_DIR;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> Docs() {
  std::vector<fs::path> docs{kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  return docs;
}

// Every line of the docs, or every `code span`, with its doc and line.
struct Span {
  std::string where, text;
};
std::vector<Span> DocText(bool code_spans_only) {
  std::vector<Span> spans;
  for (const fs::path& doc : Docs()) {
    std::ifstream in(doc);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string where = doc.lexically_relative(kRoot).string() + ":" + std::to_string(n);
      if (!code_spans_only) {
        spans.push_back({where, line});
        continue;
      }
      static const std::regex span("`([^`]+)`");
      for (std::sregex_iterator it(line.begin(), line.end(), span), end; it != end; ++it)
        spans.push_back({where, (*it)[1]});
    }
  }
  return spans;
}

struct Known {
  std::set<std::string> gtests, suites;
  // "module.Class" and "module.Class.method" of tests/python.
  std::set<std::string> py;
};

Known KnownTests() {
  Known k;
  static const std::regex gtest(R"(\b(?:TEST|TEST_F|TEST_P|TYPED_TEST)\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  for (const char* dir : {"tests", "fuzz"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h") continue;
      const std::string src = Slurp(e.path());
      for (std::sregex_iterator it(src.begin(), src.end(), gtest), end; it != end; ++it) {
        k.gtests.insert((*it)[1].str() + "." + (*it)[2].str());
        k.suites.insert((*it)[1]);
      }
    }
  }
  // Python: a method belongs to the class whose block it is indented under.
  static const std::regex cls(R"(^class (\w+)\b)"), meth(R"(^    def (test_\w+))");
  for (const auto& e : fs::directory_iterator(kRoot / "tests/python")) {
    if (e.path().extension() != ".py") continue;
    const std::string mod = e.path().stem().string();
    std::ifstream in(e.path());
    std::string line, current;
    std::smatch m;
    while (std::getline(in, line)) {
      if (std::regex_search(line, m, cls)) {
        current = m[1];
        k.py.insert(mod + "." + current);
      } else if (!current.empty() && std::regex_search(line, m, meth)) {
        k.py.insert(mod + "." + current + "." + m[1].str());
      }
    }
  }
  return k;
}

TEST(DocsCitations, EveryCitedTestExists) {
  const Known k = KnownTests();
  ASSERT_GT(k.gtests.size(), 100u);
  ASSERT_GT(k.py.size(), 50u);
  std::vector<std::string> missing;
  // `Suite.Name` (a GoogleTest) or `Suite.*`, possibly inside a longer span.
  static const std::regex gname(R"((?:^|[^\w.])([A-Z]\w+)\.([A-Z]\w+|\*))");
  static const std::regex pname(R"((?:^|[^\w.])(test_\w+)\.([A-Z]\w+)(?:\.(test_\w+))?)");
  static const std::regex bare(R"(^[A-Z]\w+\.[A-Z]\w+$)");
  // `.Name` alone: another test of the suite cited last on the same line.
  static const std::regex same_suite(R"(^\.([A-Z]\w+)$)");
  std::string line, last_suite;
  for (const Span& s : DocText(/*code_spans_only=*/true)) {
    if (s.where != line) line = s.where, last_suite.clear();
    std::smatch short_name;
    if (std::regex_match(s.text, short_name, same_suite) && !last_suite.empty() &&
        !k.gtests.count(last_suite + short_name[1].str()))
      missing.push_back(s.where + ": " + last_suite + short_name[1].str());
    for (std::sregex_iterator it(s.text.begin(), s.text.end(), gname), end; it != end; ++it) {
      const std::string suite = (*it)[1], name = (*it)[2];
      if (k.suites.count(suite)) last_suite = suite + ".";
      if (name == "*") {
        if (!k.suites.count(suite) && !k.py.count("test_" + suite)) missing.push_back(s.where + ": " + suite + ".*");
        continue;
      }
      // A span that is only `A.B` is a test citation; elsewhere `A.B` counts
      // when A is a suite (so `GGUFWriter.add_custom_alignment` is not one).
      const bool cited = k.suites.count(suite) || std::regex_match(s.text, bare);
      if (cited && !k.gtests.count(suite + "." + name)) missing.push_back(s.where + ": " + suite + "." + name);
    }
    for (std::sregex_iterator it(s.text.begin(), s.text.end(), pname), end; it != end; ++it) {
      std::string name = (*it)[1].str() + "." + (*it)[2].str();
      if ((*it)[3].matched) name += "." + (*it)[3].str();
      if (!k.py.count(name)) missing.push_back(s.where + ": " + name);
    }
  }
  EXPECT_TRUE(missing.empty()) << "cited tests that do not exist:\n" << [&] {
    std::string out;
    for (const auto& m : missing) out += "  " + m + "\n";
    return out;
  }();
}

TEST(DocsCitations, EveryCitedRepositoryPathExists) {
  std::vector<std::string> missing;
  // A path into one of the repository's folders, in code or in prose; `<name>` is a placeholder.
  static const std::regex path(
      R"((?:^|[^\w./-])((?:src|include|tests|docs|python|bench|fuzz|scripts|cmake)/[\w./<>*-]*[\w>/*]))");
  size_t checked = 0;
  for (const Span& s : DocText(/*code_spans_only=*/false)) {
    for (std::sregex_iterator it(s.text.begin(), s.text.end(), path), end; it != end; ++it) {
      std::string p = (*it)[1];
      ++checked;
      // With a placeholder or wildcard, the folder before it must exist.
      const size_t wild = p.find_first_of("<*");
      if (wild != std::string::npos) p = p.substr(0, p.rfind('/', wild));
      if (!fs::exists(kRoot / p)) missing.push_back(s.where + ": " + (*it)[1].str());
    }
  }
  EXPECT_GT(checked, 50u);
  EXPECT_TRUE(missing.empty()) << "cited paths that do not exist:\n" << [&] {
    std::string out;
    for (const auto& m : missing) out += "  " + m + "\n";
    return out;
  }();
}

// A `K3PACK_*` / `K3_*` variable the docs tell a user or a test to set must be
// one the code (or the scripts, setup.py, the tests) reads.
TEST(DocsCitations, EveryCitedEnvironmentVariableIsRead) {
  std::string code;
  for (const char* dir : {"src", "python", "scripts", "bench", "fuzz", "tests", "cmake"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && ext != ".md" && ext != ".so" && ext != ".svg") code += Slurp(e.path());
    }
  }
  for (const char* file : {"setup.py", "Makefile", "CMakeLists.txt"}) code += Slurp(kRoot / file);
  static const std::regex var(R"(\b(K3PACK_[A-Z0-9_]+|K3_[A-Z0-9_]+)\b)");
  std::set<std::string> missing, seen;
  for (const Span& s : DocText(/*code_spans_only=*/false)) {
    for (std::sregex_iterator it(s.text.begin(), s.text.end(), var), end; it != end; ++it) {
      const std::string v = (*it)[1];
      seen.insert(v);
      if (code.find(v) == std::string::npos) missing.insert(s.where + ": " + v);
    }
  }
  EXPECT_GT(seen.size(), 20u);
  EXPECT_TRUE(missing.empty()) << "documented variables nothing reads:\n" << [&] {
    std::string out;
    for (const auto& m : missing) out += "  " + m + "\n";
    return out;
  }();
}

// A command line the docs show (`k3pack CMD ... --flag`, inline or in a
// synopsis block) uses only options that CMD's --help lists.
TEST(DocsCitations, EveryOptionShownForACommandExists) {
  std::map<std::string, std::string> help;  // "trace sweep" -> its --help
  auto help_of = [&](const std::string& cmd) -> const std::string& {
    auto it = help.find(cmd);
    if (it == help.end()) it = help.emplace(cmd, k3pack::testing_cli::Cli(cmd + " --help").out).first;
    return it->second;
  };
  // Code spans, and the lines of fenced blocks joined (a synopsis spans several lines).
  std::vector<Span> texts = DocText(/*code_spans_only=*/true);
  for (const fs::path& doc : Docs()) {
    std::ifstream in(doc);
    std::string line, block;
    bool fenced = false;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.rfind("```", 0) == 0) {
        if (fenced) texts.push_back({doc.lexically_relative(kRoot).string() + ":" + std::to_string(n), block});
        fenced = !fenced;
        block.clear();
      } else if (fenced) {
        block += line + "\n";
      }
    }
  }
  static const std::regex command(R"(k3pack (trace (?:gen|replay|sweep)|[a-z][a-z-]+)\b)");
  static const std::regex option(R"((?:^|[\s\[|(])(--[a-z][a-z0-9-]*))");
  std::vector<std::string> missing;
  size_t checked = 0;
  for (const Span& t : texts) {
    std::vector<std::pair<size_t, std::string>> cmds;  // where each command starts
    for (std::sregex_iterator it(t.text.begin(), t.text.end(), command), end; it != end; ++it)
      cmds.emplace_back(it->position(), (*it)[1]);
    for (size_t i = 0; i < cmds.size(); ++i) {
      const std::string& cmd = cmds[i].second;
      const std::string& h = help_of(cmd);
      if (h.find("usage: k3pack " + cmd) == std::string::npos) continue;  // not a command (`k3pack CMD`)
      const size_t from = cmds[i].first, to = i + 1 < cmds.size() ? cmds[i + 1].first : t.text.size();
      std::string rest = t.text.substr(from, to - from);
      rest = rest.substr(0, rest.find('#'));  // a shell comment
      for (std::sregex_iterator it(rest.begin(), rest.end(), option), end; it != end; ++it) {
        const std::string opt = (*it)[1];
        ++checked;
        if (opt == "--help" || opt == "--version") continue;
        if (!std::regex_search(h, std::regex("(^|\\s)" + opt + "(\\s|$)")))
          missing.push_back(t.where + ": k3pack " + cmd + " " + opt);
      }
    }
  }
  EXPECT_GT(checked, 100u);
  EXPECT_TRUE(missing.empty()) << "options the docs show that the command does not take:\n" << [&] {
    std::string out;
    for (const auto& m : missing) out += "  " + m + "\n";
    return out;
  }();
}

// A synopsis block (a fenced block of `k3pack CMD [...]` lines) is where a
// reader looks for what CMD takes, so it lists every option of CMD's --help
// but deprecated spellings; `[pack options]` stands for `k3pack pack`'s. A
// block of examples (no `[--option]`) is not a synopsis.
// Session 32 found synth's, pack's and load's synopses without --wait,
// --progress or --ep-size/--ep-rank, which the commands had taken for a while.
TEST(DocsCitations, EverySynopsisListsEveryOption) {
  auto options_of = [](const std::string& cmd) {
    std::set<std::string> opts;
    std::istringstream help(k3pack::testing_cli::Cli(cmd + " --help").out);
    static const std::regex opt(R"(^  (--[a-z][a-z0-9-]*)\b)");
    std::string line, name;
    std::smatch m;
    while (std::getline(help, line)) {
      if (std::regex_search(line, m, opt)) {
        name = m[1];
        if (name != "--help") opts.insert(name);
      } else if (!name.empty() && line.find("      deprecated") == 0) {
        opts.erase(name);
      }
    }
    return opts;
  };
  static const std::regex head(R"(^k3pack (trace (?:gen|replay|sweep)|[a-z][a-z-]+)\b)");
  std::vector<std::string> missing;
  size_t synopses = 0;
  for (const fs::path& doc : Docs()) {
    std::ifstream in(doc);
    std::string line, cmd, text, where;
    bool fenced = false;
    auto finish = [&] {
      // An example (README's "Typical use") shows a few options; a synopsis brackets them.
      if (cmd.empty() || text.find("[--") == std::string::npos) return cmd.clear();
      ++synopses;
      const bool with_pack = text.find("[pack options]") != std::string::npos;
      const std::set<std::string> pack = with_pack ? options_of("pack") : std::set<std::string>{};
      for (const std::string& o : options_of(cmd)) {
        if (pack.count(o) || std::regex_search(text, std::regex("(^|[\\s\\[|(])" + o + "([\\s\\]|)=]|$)"))) continue;
        missing.push_back(where + ": k3pack " + cmd + " " + o);
      }
      cmd.clear();
    };
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.rfind("```", 0) == 0) {
        finish();
        fenced = !fenced;
        continue;
      }
      if (!fenced) continue;
      std::smatch m;
      if (std::regex_search(line, m, head)) {
        finish();
        cmd = m[1], text.clear();
        where = doc.lexically_relative(kRoot).string() + ":" + std::to_string(n);
      }
      if (!cmd.empty()) text += line + "\n";
    }
  }
  EXPECT_GE(synopses, 5u);
  EXPECT_TRUE(missing.empty()) << "options a synopsis leaves out:\n" << [&] {
    std::string out;
    for (const auto& m : missing) out += "  " + m + "\n";
    return out;
  }();
}

}  // namespace
