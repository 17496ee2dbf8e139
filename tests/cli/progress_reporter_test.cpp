// The one progress reporter (src/util/progress.h), driven with an injected
// clock: cadence per mode, ETA hiding, holes kept out of throughput, JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/progress.h"

namespace k3pack {
namespace {

struct Harness {
  double now = 0;
  std::FILE* f = std::tmpfile();
  ~Harness() { std::fclose(f); }
  ProgressReporter::Options Opts(ProgressMode mode) {
    ProgressReporter::Options o;
    o.mode = mode;
    o.out = f;
    o.clock = [this] { return now; };
    return o;
  }
  std::string Text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    return s;
  }
  std::vector<std::string> Lines() {
    std::vector<std::string> out;
    std::istringstream is(Text());
    for (std::string l; std::getline(is, l);) out.push_back(l);
    return out;
  }
};

Progress Bytes(uint64_t done, uint64_t total, const std::string& phase = "build") {
  Progress p;
  p.phase = phase;
  p.done_bytes = done;
  p.total_bytes = total;
  p.done_objects = done / 100;
  p.total_objects = total / 100;
  return p;
}

TEST(ProgressMode, AutoIsBarOnTerminalAndLinesOtherwise) {
  EXPECT_EQ(*ParseProgressMode("auto", true), ProgressMode::kBar);
  EXPECT_EQ(*ParseProgressMode("auto", false), ProgressMode::kLines);
  EXPECT_EQ(*ParseProgressMode("json", true), ProgressMode::kJson);
  EXPECT_EQ(*ParseProgressMode("none", true), ProgressMode::kNone);
  auto bad = ParseProgressMode("fancy", true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("--progress"), std::string::npos);
  EXPECT_NE(bad.error().message().find("fancy"), std::string::npos);
}

TEST(ProgressReporter, LinesModePrintsEveryTenSecondsOnly) {
  Harness h;
  {
    ProgressReporter r(h.Opts(ProgressMode::kLines));
    for (int t = 0; t <= 25; ++t) {
      h.now = t;
      r.Update(Bytes(uint64_t(t) * 1000, 100000));
    }
  }
  const auto lines = h.Lines();
  ASSERT_EQ(lines.size(), 2u) << h.Text();  // at 10 s and at 20 s
  EXPECT_NE(lines[0].find("build:"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("10.0%"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("20.0%"), std::string::npos) << lines[1];
}

TEST(ProgressReporter, LinesModeShortRunIsSilentLongRunSaysDone) {
  Harness quiet;
  {
    ProgressReporter r(quiet.Opts(ProgressMode::kLines));
    quiet.now = 3;
    r.Update(Bytes(500, 1000));
    quiet.now = 6;
    r.Update(Bytes(1000, 1000));
  }
  EXPECT_EQ(quiet.Text(), "");

  Harness loud;
  {
    ProgressReporter r(loud.Opts(ProgressMode::kLines));
    loud.now = 11;
    r.Update(Bytes(500, 1000));
    loud.now = 12;
    r.Update(Bytes(1000, 1000));
  }
  const auto lines = loud.Lines();
  ASSERT_EQ(lines.size(), 2u) << loud.Text();
  EXPECT_NE(lines[1].find("done"), std::string::npos) << lines[1];
}

TEST(ProgressReporter, JsonLinesThrottledToOneASecondPlusTheLast) {
  Harness h;
  {
    ProgressReporter r(h.Opts(ProgressMode::kJson));
    for (int i = 0; i <= 30; ++i) {  // 3 s in 0.1 s steps
      h.now = i * 0.1;
      r.Update(Bytes(uint64_t(i) * 10, 300));
    }
  }
  const auto lines = h.Lines();
  ASSERT_GE(lines.size(), 3u);
  ASSERT_LE(lines.size(), 5u) << h.Text();
  for (const auto& l : lines) {
    auto j = nlohmann::json::parse(l);  // every line is one JSON object
    EXPECT_EQ(j["phase"], "build");
    EXPECT_TRUE(j.contains("eta_s"));
  }
  auto last = nlohmann::json::parse(lines.back());
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_bytes"], 300);
  EXPECT_EQ(last["total_bytes"], 300);
}

// Whose work it is (a rank of `--ep-rank all`): after the phase in text,
// fields in JSON, the phase itself unchanged.
TEST(ProgressReporter, AScopeIsToldInEveryMode) {
  for (ProgressMode mode : {ProgressMode::kBar, ProgressMode::kLines, ProgressMode::kJson}) {
    Harness h;
    {
      ProgressReporter::Options o = h.Opts(mode);
      o.scope = "rank 1 of 2";
      o.scope_fields = {{"ep_rank", 1}, {"ep_size", 2}};
      ProgressReporter r(o);
      h.now = 11;
      r.Update(Bytes(150, 300));
      h.now = 12;
      r.Update(Bytes(300, 300));
    }
    const auto lines = h.Lines();
    ASSERT_FALSE(lines.empty());
    if (mode == ProgressMode::kJson) {
      auto j = nlohmann::json::parse(lines.back());
      EXPECT_EQ(j["phase"], "build");
      EXPECT_EQ(j["ep_rank"], 1);
      EXPECT_EQ(j["ep_size"], 2);
    } else {
      EXPECT_NE(h.Text().find("build (rank 1 of 2)"), std::string::npos) << h.Text();
    }
  }
}

// A phase reported once, already done (a short step): its rate is its
// bytes over the engine's time, not 0 (it had no earlier report to measure
// from).
TEST(ProgressReporter, APhaseToldOnceWhenDoneHasItsRate) {
  Harness h;
  {
    ProgressReporter r(h.Opts(ProgressMode::kJson));
    h.now = 5;
    Progress p = Bytes(2000, 2000, "compare");
    p.elapsed_s = 0.5;
    r.Update(p);
  }
  const auto lines = h.Lines();
  ASSERT_EQ(lines.size(), 1u) << h.Text();
  const auto j = nlohmann::json::parse(lines.front());
  EXPECT_EQ(j["done"], true);
  EXPECT_DOUBLE_EQ(j["bytes_per_s"].get<double>(), 4000.0);
}

TEST(ProgressReporter, AStoppedRunIsNeverReportedDone) {
  // The last report of a run stopped early (Ctrl-C, an error) says where it
  // stopped; "done" stays false, in JSON and in lines.
  Harness json, lines;
  {
    ProgressReporter j(json.Opts(ProgressMode::kJson)), l(lines.Opts(ProgressMode::kLines));
    json.now = lines.now = 20;
    Progress p = Bytes(256, 384);
    j.Update(p);
    l.Update(p);
    p.final = true;
    j.Update(p);
    l.Update(p);
  }
  auto last = nlohmann::json::parse(json.Lines().back());
  EXPECT_EQ(last["done"], false) << json.Text();
  EXPECT_EQ(last["stopped"], true) << json.Text();
  EXPECT_EQ(last["done_bytes"], 256);
  EXPECT_EQ(lines.Text().find("done,"), std::string::npos) << lines.Text();
  EXPECT_NE(lines.Text().find("stopped, "), std::string::npos) << lines.Text();
}

TEST(ProgressReporter, EtaHiddenUntilMeaningful) {
  Harness h;
  ProgressReporter r(h.Opts(ProgressMode::kJson));
  h.now = 0;
  r.Update(Bytes(0, 1000000));
  h.now = 2;  // too early
  r.Update(Bytes(200000, 1000000));
  h.now = 4;  // 40% in 4 s: 6 s left
  r.Update(Bytes(400000, 1000000));
  const auto lines = h.Lines();
  ASSERT_EQ(lines.size(), 3u) << h.Text();
  EXPECT_TRUE(nlohmann::json::parse(lines[1])["eta_s"].is_null());
  EXPECT_NEAR(nlohmann::json::parse(lines[2])["eta_s"].get<double>(), 6.0, 1e-6);
}

TEST(ProgressReporter, HolesAreNotThroughputAndResumedWorkIsNotThisRunsSpeed) {
  Harness h;
  ProgressReporter r(h.Opts(ProgressMode::kJson));
  // A resumed build: half was done before; this run copies 100 MB of data in
  // 10 s while skipping 300 MB of holes.
  Progress p = Bytes(500'000'000, 1'000'000'000);
  p.copied_bytes = 0;
  h.now = 0;
  r.Update(p);
  p.done_bytes = 900'000'000;
  p.copied_bytes = 100'000'000;
  h.now = 10;
  r.Update(p);
  const auto last = nlohmann::json::parse(h.Lines().back());
  EXPECT_NEAR(last["bytes_per_s"].get<double>(), 10e6, 1);  // 100 MB / 10 s, not 400 MB / 10 s
  EXPECT_NEAR(last["eta_s"].get<double>(), 2.5, 1e-6);      // 40% of the whole in 10 s, 10% left
}

TEST(ProgressReporter, BarRedrawsOneLineAndEndsIt) {
  Harness h;
  {
    ProgressReporter r(h.Opts(ProgressMode::kBar));
    for (int i = 0; i <= 10; ++i) {
      h.now = i;
      r.Update(Bytes(uint64_t(i) * 100, 1000));
    }
  }
  const std::string s = h.Text();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1) << s;  // one line, ended once
  EXPECT_EQ(s.back(), '\n');
  EXPECT_NE(s.find("100.0%"), std::string::npos);
  EXPECT_NE(s.find("[###"), std::string::npos);
  EXPECT_NE(s.find("ETA"), std::string::npos);  // shown mid-way (after 3 s)

  Harness open;
  {
    ProgressReporter r(open.Opts(ProgressMode::kBar));
    r.Update(Bytes(100, 1000));
    r.Finish();  // interrupted work: the line is still ended
  }
  EXPECT_EQ(open.Text().back(), '\n');
}

TEST(ProgressReporter, ItemsWithoutBytesShowCountAndItemRate) {
  Harness h;
  ProgressReporter r(h.Opts(ProgressMode::kJson));
  Progress p;
  p.phase = "sweep";
  p.unit = "simulations";
  p.total_objects = 30;
  p.done_objects = 0;
  h.now = 0;
  r.Update(p);
  p.done_objects = 10;
  h.now = 5;
  r.Update(p);
  const auto j = nlohmann::json::parse(h.Lines().back());
  EXPECT_EQ(j["unit"], "simulations");
  EXPECT_NEAR(j["objects_per_s"].get<double>(), 2.0, 1e-9);
  EXPECT_NEAR(j["eta_s"].get<double>(), 10.0, 1e-6);
}

}  // namespace
}  // namespace k3pack
