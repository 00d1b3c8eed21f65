// The experiment grid: config parsing and its refusals, grid expansion, and the CSV
// and Markdown reports on fixed results.
#include "examples/fashion_mnist/experiment.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::fashion_mnist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ExperimentConfigTest, ParsesListsScalarsQuotesAndComments) {
  auto c = ParseExperimentConfig(R"cfg(
# a comment
rules = ["mean", "bucketing(s=2)+centered_clipping(tau=10, iterations=3)"]  # commas in quotes
attacks = [signflip, "ipm(eps=0.5)"]
byzantine = [0, 2]
worker_momentum = [0, 0.9]
seeds = [1, 2]
workers = 12
lr = 0.5
model = "cnn"
error_feedback = true
)cfg");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->rules,
              ElementsAre("mean", "bucketing(s=2)+centered_clipping(tau=10, iterations=3)"));
  EXPECT_THAT(c->attacks, ElementsAre("signflip", "ipm(eps=0.5)"));
  EXPECT_THAT(c->byzantine, ElementsAre(0u, 2u));
  EXPECT_THAT(c->worker_momentum, ElementsAre(0.0, 0.9));
  EXPECT_EQ(c->workers, 12u);
  EXPECT_EQ(c->lr, 0.5);
  EXPECT_EQ(c->model, "cnn");
  EXPECT_TRUE(c->error_feedback);
  EXPECT_EQ(c->steps, 1000u);  // default kept
}

TEST(ExperimentConfigTest, RefusesWithTheLineNumber) {
  auto err = [](const char* text) {
    return std::string(ParseExperimentConfig(text).status().message());
  };
  EXPECT_EQ(err("workers = 12\nbyzantine = [-1]"),
            "config line 2: byzantine: '-1' is not an unsigned integer");
  EXPECT_THAT(err("rulez = [mean]"),
              HasSubstr("config line 1: unknown key 'rulez'; known: attacks"));
  EXPECT_EQ(err("steps = 5\nsteps = 6"), "config line 2: steps: given twice");
  EXPECT_EQ(err("rules = [\"mean\""), "config line 1: rules: array without a closing ']'");
  EXPECT_EQ(err("rules = []"), "config line 1: rules: empty list");
  EXPECT_EQ(err("workers = [1, 2]"), "config line 1: workers: one value expected, not a list");
  EXPECT_EQ(err("lr"), "config line 1: expected 'key = value', got 'lr'");
  EXPECT_EQ(err("error_feedback = yes"),
            "config line 1: error_feedback: 'yes' is not true or false");
  EXPECT_EQ(err("rules = [\"mean]"), "config line 1: rules: unterminated string");
  EXPECT_THAT(err("workers = 4\nbyzantine = [4]"),
              HasSubstr("byzantine 4 must be below workers 4"));
  EXPECT_THAT(err("worker_momentum = [1]"), HasSubstr("not in [0, 1)"));
  EXPECT_THAT(err("bandwidths = [20, -1]"), HasSubstr("bandwidth -1 Mbit/s is negative"));
  EXPECT_THAT(err("target_accuracy = 80"), HasSubstr("target_accuracy 80 is not in [0, 1]"));
  EXPECT_EQ(err("latency_ms = 1.5"), "config line 1: latency_ms: '1.5' is not an unsigned integer");
  EXPECT_THAT(err("tau0 = 0"), HasSubstr("tau0 0 is not in [1, tau_max 32]"));
  EXPECT_THAT(err("tau0 = 9\ntau_max = 8"), HasSubstr("tau0 9 is not in [1, tau_max 8]"));
  EXPECT_THAT(err("workers = 8\nelastic_workers = 8"), HasSubstr("need fewer than workers 8"));
  EXPECT_THAT(err("elastic_workers = 2\nelastic_join = 500\nelastic_leave = 400"),
              HasSubstr("elastic_leave 0 or after elastic_join"));
  EXPECT_THAT(err("steps = 100\nelastic_workers = 2\nelastic_join = 100"),
              HasSubstr("elastic_join below steps 100"));
}

TEST(ExperimentConfigTest, SetReplacesTheFilesLineForItsKey) {
  const std::string text =
      "rules = [\"mean\", \"caf\"]\nsplits = [\"iid\", \"dirichlet(alpha=1)\"]\n"
      "steps = 1000\nseeds = [1, 2, 3]";
  const std::vector<std::string> set = {"splits = [\"iid\"]  # one split", "seeds = [2]",
                                        "workers = 25"};
  auto c = ParseExperimentConfig(text, set);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->splits, ElementsAre("iid"));
  EXPECT_THAT(c->seeds, ElementsAre(2u));
  EXPECT_EQ(c->workers, 25u);  // a key the file does not have
  EXPECT_THAT(c->rules, ElementsAre("mean", "caf"));
  EXPECT_EQ(c->steps, 1000u);

  auto err = [&](std::vector<std::string> overrides) {
    return std::string(ParseExperimentConfig(text, overrides).status().message());
  };
  EXPECT_EQ(err({"seeds = [1]", "seeds = [2]"}), "--set 2: seeds: given twice");
  EXPECT_THAT(err({"split = [\"iid\"]"}), HasSubstr("--set 1: unknown key 'split'"));
  EXPECT_EQ(err({"steps = -5"}), "--set 1: steps: '-5' is not an unsigned integer");
  EXPECT_EQ(err({"steps"}), "--set 1: expected 'key = value', got 'steps'");
  // The file is still checked where --set replaces it, and in full elsewhere.
  EXPECT_THAT(std::string(ParseExperimentConfig("steps = 5\nstepz = 6", set).status().message()),
              HasSubstr("config line 2: unknown key 'stepz'"));
  EXPECT_EQ(std::string(ParseExperimentConfig("seeds = [1]\nseeds = [2]", {}).status().message()),
            "config line 2: seeds: given twice");
}

TEST(ExperimentConfigTest, LinksAndTargetMakeCellsPerBandwidth) {
  auto c = ParseExperimentConfig(
      "codecs = [\"fp32\", \"cat\"]\nbandwidths = [20, 0]\nlatency_ms = 2\ntarget_accuracy = "
      "0.8\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->bandwidths, ElementsAre(20.0, 0.0));
  EXPECT_EQ(c->latency_ms, 2u);
  EXPECT_EQ(c->target_accuracy, 0.8);
  const std::vector<Cell> cells = ExpandGrid(*c);
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[0].Label(), "mean | none | f=0 | iid | fp32 | wm=0 | seed 1 | 20 Mbit/s");
  EXPECT_EQ(cells[1].Label(), "mean | none | f=0 | iid | fp32 | wm=0 | seed 1");
  EXPECT_EQ(cells[3].codec, "cat");
  EXPECT_EQ(StrategyCodec("cat"), "topk(0.1, level=cat, min=0.001)+varint+fp16");
  EXPECT_EQ(StrategyCodec("topk(0.01)"), "topk(0.01)");
  c->pull_codec = "fp16";
  const Strategy cat_3lc = ParseStrategy("cat|3lc(s=1.9)", *c);
  EXPECT_EQ(cat_3lc.name, "cat");
  EXPECT_EQ(cat_3lc.push_codec, "topk(0.1, level=cat, min=0.001)+varint+fp16");
  EXPECT_EQ(cat_3lc.pull_codec, "3lc(s=1.9)");
  EXPECT_EQ(ParseStrategy("fp32", *c).pull_codec, "fp16");  // the config's
  EXPECT_EQ(ParseStrategy("fp32|", *c).pull_codec, "");     // dense, explicitly
  EXPECT_EQ(cat_3lc.comm, "sync");
  const Strategy local = ParseStrategy("cat+adacomm|fp16", *c);
  EXPECT_EQ(local.name, "cat+adacomm");
  EXPECT_EQ(local.push_codec, "topk(0.1, level=cat, min=0.001)+varint+fp16");
  EXPECT_EQ(local.pull_codec, "fp16");
  EXPECT_EQ(local.comm, "adacomm");
  EXPECT_EQ(ParseStrategy("+adacomm", *c).comm, "sync") << "no push codec: not a suffix";
  const Strategy espresso = ParseStrategy("espresso+cat+adacomm|fp16", *c);
  EXPECT_EQ(espresso.name, "espresso+cat+adacomm");
  EXPECT_EQ(espresso.push_codec, "auto");
  EXPECT_THAT(espresso.candidates,
              ElementsAre("fp32", "fp16", "topk(0.1, level=cat, min=0.001)+varint+fp16"));
  EXPECT_EQ(espresso.comm, "adacomm");
  EXPECT_THAT(ParseStrategy("espresso", *c).candidates, testing::Contains("3lc(s=1.9)"));
  EXPECT_TRUE(ParseStrategy("fp16", *c).candidates.empty());
}

TEST(ExperimentReportTest, RunsJsonHasTimeToTargetPerRun) {
  ExperimentConfig c;
  c.target_accuracy = 0.7;
  c.latency_ms = 1;
  CellResult reached, missed;
  reached.cell = {"mean", "none", 0, "iid", "cat", 0.0, "constant", 1, 20};
  reached.evals = {{0, 0.1}, {100, 0.72}, {200, 0.8}};
  reached.eval_seconds = {0.5, 12.25, 24};
  reached.final_accuracy = 0.8;
  reached.bytes_sent = 123456;
  reached.wall_seconds = 30;
  missed = reached;
  missed.cell.codec = "fp32|fp16";
  missed.evals = {{0, 0.1}, {100, 0.6}};
  missed.eval_seconds = {0.5, 40};
  missed.final_accuracy = 0.6;
  CellResult local = reached;
  local.cell.codec = "fp16+adacomm|fp16";
  local.periods = {{0, 0, 8}, {40, 5, 6}};
  local.plans = {
      {.step = 3, .codecs = "w=fp16, b=fp32", .predicted_seconds = 0.5, .measured_seconds = 0.75}};
  EXPECT_EQ(SecondsToTarget(reached, 0.7), 12.25);
  EXPECT_EQ(SecondsToTarget(missed, 0.7), std::nullopt);
  const std::string json = RunsJson(c, {reached, missed, local});
  EXPECT_THAT(
      json,
      HasSubstr(
          "{\"model\": \"mlp(hidden=128)\", \"bandwidth_mbps\": 20, \"latency_ms\": 1, "
          "\"strategy\": \"cat\", \"codec\": \"topk(0.1, level=cat, min=0.001)+varint+fp16\", "
          "\"pull_codec\": \"\", \"comm\": \"sync\""));
  EXPECT_THAT(
      json,
      HasSubstr("\"target_accuracy\": 0.7, \"seconds_to_target\": 12.25, \"final_accuracy\": 0.8, "
                "\"bytes_sent\": 123456, \"train_seconds\": 24, \"wall_seconds\": 30"));
  EXPECT_THAT(json, HasSubstr("\"curve\": [[0.5, 0, 0.1], [12.25, 100, 0.72], [24, 200, 0.8]]}"));
  EXPECT_THAT(json,
              HasSubstr("\"strategy\": \"fp32\", \"codec\": \"fp32\", \"pull_codec\": \"fp16\""));
  EXPECT_THAT(json, HasSubstr("\"seconds_to_target\": null, \"final_accuracy\": 0.6"));
  EXPECT_THAT(json, HasSubstr("\"strategy\": \"fp16+adacomm\", \"codec\": \"fp16\", "
                              "\"pull_codec\": \"fp16\", \"comm\": \"adacomm\""));
  EXPECT_THAT(json, HasSubstr("\"periods\": [[0, 0, 8], [40, 5, 6]], \"plans\": [{\"step\": 3, "
                              "\"codecs\": \"w=fp16, b=fp32\", \"predicted_seconds\": 0.5, "
                              "\"measured_seconds\": 0.75}], \"curve\""));
  EXPECT_THAT(json, HasSubstr("\"periods\": [], \"plans\": [], \"curve\": [[0.5, 0, 0.1], [12.25"));
}

// Every config under examples/fashion_mnist/experiments/ parses, with the cells its
// comment promises for the adaptive ones.
TEST(ExperimentConfigTest, TheCheckedInConfigsParse) {
  const std::filesystem::path dir =
      std::filesystem::path(PS_SOURCE_DIR) / "examples/fashion_mnist/experiments";
  size_t configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    auto c = ParseExperimentConfig(text.str());
    ASSERT_TRUE(c.ok()) << entry.path() << ": " << c.status();
    ++configs;
    const std::string name = entry.path().filename().string();
    if (name == "adaptive.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 48u);  // 12 strategies x 4 links
    }
    if (name == "adaptive_quick.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 6u);  // 3 strategies x 2 links
    }
    if (name == "default.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 40u);  // 4 rules x 5 attack settings x 2 splits
    }
    if (name == "robustness.toml") {
      // 11 rules x (1 + 6 attacks) x 2 f x 3 splits x 2 schedules x 3 seeds, the no-attack
      // cell once per f.
      EXPECT_EQ(ExpandGrid(*c).size(), 11u * 7 * 2 * 3 * 2 * 3);
    }
    if (name == "robustness_n25.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 120u);
    }
    if (name == "targets.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 42u);  // 7 attack settings x 2 splits x 3 seeds
    }
    if (name == "bite_check.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 4u);
    }
    if (name == "dirichlet01.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 20u);
    }
    if (name == "elastic.toml") {
      EXPECT_EQ(ExpandGrid(*c).size(), 6u);  // 2 rules x 3 seeds
      EXPECT_EQ(c->elastic_workers, 4u);
      EXPECT_EQ(c->elastic_join, 250u);
      EXPECT_EQ(c->elastic_leave, 750u);
      // The static baseline of docs/evaluation.md, "Workers that come and go".
      const std::vector<std::string> baseline = {"workers = 6", "elastic_workers = 0"};
      auto s = ParseExperimentConfig(text.str(), baseline);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->workers, 6u);
      EXPECT_EQ(s->elastic_workers, 0u);
    }
  }
  EXPECT_GE(configs, 10u);
}

TEST(ExperimentGridTest, ExpandsEveryCombinationWithOneBaselinePerF0) {
  ExperimentConfig c;
  c.rules = {"mean", "median"};
  c.attacks = {"signflip", "alie"};
  c.byzantine = {0, 2};
  c.seeds = {1, 2};
  const std::vector<Cell> cells = ExpandGrid(c);
  // Per rule: f = 0 once (attack none) and f = 2 per attack, each for 2 seeds.
  ASSERT_EQ(cells.size(), 2u * (1 + 2) * 2);
  EXPECT_EQ(cells[0].attack, "none");
  EXPECT_EQ(cells[0].byzantine, 0u);
  EXPECT_EQ(cells[2].attack, "signflip");
  EXPECT_EQ(cells[2].byzantine, 2u);
  EXPECT_EQ(cells[5].Label(), "mean | alie | f=2 | iid | fp32 | wm=0 | seed 2");
}

TEST(ExperimentReportTest, CsvAndMarkdownCarryTheResults) {
  ExperimentConfig c;
  c.rules = {"mean", "clip(2)+nnm+trimmed_mean"};
  c.attacks = {"none", "signflip", "alie"};
  c.byzantine = {2};
  std::vector<CellResult> results;
  const double acc[2][3] = {{0.85, 0.10, 0.80}, {0.84, 0.83, 0.82}};
  for (int r = 0; r < 2; ++r) {
    for (int a = 0; a < 3; ++a) {
      CellResult x;
      x.cell = {c.rules[r], c.attacks[a], 2, "iid", "fp32", 0.0, "constant", 1};
      x.evals = {{0, 0.1}, {100, acc[r][a]}};
      x.final_accuracy = acc[r][a];
      x.wall_seconds = 3;
      x.refused_pushes = static_cast<uint64_t>(r + a);
      results.push_back(x);
    }
  }
  results[1].error = "worker 3: boom, \"quoted\"";
  const std::string csv = ResultsCsv(results);
  EXPECT_THAT(csv, HasSubstr("rule,attack,byzantine,split,codec,worker_momentum,lr_schedule,seed,"
                             "bandwidth_mbps,step,test_accuracy\n"));
  EXPECT_THAT(csv,
              HasSubstr("clip(2)+nnm+trimmed_mean,alie,2,iid,fp32,0,constant,1,0,100,0.8200\n"));
  EXPECT_THAT(
      SummaryCsv(results),
      HasSubstr("final_accuracy,diverged,wall_seconds,refused_pushes,error\n"
                "mean,none,2,iid,fp32,0,constant,1,0,0.8500,false,3.0,0,\n"
                "mean,signflip,2,iid,fp32,0,constant,1,0,0.1000,false,3.0,1,\"worker 3: boom, "
                "\"\"quoted\"\"\"\n"));
  const std::string md = MarkdownTable(c, results);
  EXPECT_THAT(md, HasSubstr("| rule | worker momentum | lr schedule | split | codec | no attack | "
                            "signflip | alie | worst | drop |"));
  EXPECT_THAT(md, HasSubstr("| `mean` | 0 | constant | iid | fp32 | 0.8500 | 0.1000 | 0.8000 | "
                            "0.1000 | 75.00 |"));
  EXPECT_THAT(md, HasSubstr("| `clip(2)+nnm+trimmed_mean` | 0 | constant | iid | fp32 | 0.8400 | "
                            "0.8300 | 0.8200 | 0.8200 | 2.00 |"));
  EXPECT_THAT(md, HasSubstr("lr 0.05 momentum 0.9 on the shards.\n"));
  // Local-update cells run the optimizer on the workers; the settings say so.
  results[0].cell.codec = "fp16+adacomm";
  EXPECT_THAT(MarkdownTable(c, results),
              HasSubstr("lr 0.05 momentum 0.9 (on the shards; in `+adacomm` cells on the workers, "
                        "tau0 8, tau_max 32, and the shards apply the aggregated change with lr "
                        "1, momentum 0).\n"));
}

TEST(ExperimentReportTest, SeedsSpreadAndAttacksThatDoNotBite) {
  ExperimentConfig c;
  c.rules = {"mean", "caf"};
  c.attacks = {"none", "ipm", "alie_opt"};
  c.byzantine = {2};
  c.seeds = {1, 2};
  c.lr_schedules = {"step(every=500, gamma=0.5)"};
  // Final accuracy per rule, attack and seed: ipm costs the mean 0.5 points (no bite),
  // alie_opt 40.
  const double acc[2][3][2] = {{{0.85, 0.87}, {0.845, 0.865}, {0.45, 0.47}},
                               {{0.84, 0.86}, {0.83, 0.85}, {0.81, 0.81}}};
  std::vector<CellResult> results;
  for (int r = 0; r < 2; ++r) {
    for (int a = 0; a < 3; ++a) {
      for (int seed = 0; seed < 2; ++seed) {
        CellResult x;
        x.cell = {c.rules[r],
                  c.attacks[a],
                  2,
                  "dirichlet(alpha=0.1)",
                  "fp32",
                  0.9,
                  c.lr_schedules[0],
                  static_cast<uint64_t>(seed + 1)};
        x.final_accuracy = acc[r][a][seed];
        results.push_back(x);
      }
    }
  }
  const std::string md = MarkdownTable(c, results);
  EXPECT_THAT(md, HasSubstr("(mean over 2 seed(s) ± their standard deviation)"));
  EXPECT_THAT(md, HasSubstr("† = the attack costs `mean` less than 2 points here"));
  // sd of {0.85, 0.87} = 0.0141; ipm marked in both rows, alie_opt in neither.
  EXPECT_THAT(md, HasSubstr("| `mean` | 0.9 | step(every=500, gamma=0.5) | dirichlet(alpha=0.1) | "
                            "fp32 | 0.8600 ± 0.0141 | 0.8550 ± 0.0141 † | 0.4600 ± 0.0141 | "
                            "0.4600 | 40.00 |"));
  EXPECT_THAT(md, HasSubstr("| `caf` | 0.9 | step(every=500, gamma=0.5) | dirichlet(alpha=0.1) | "
                            "fp32 | 0.8500 ± 0.0141 | 0.8400 ± 0.0141 † | 0.8100 ± 0.0000 | "
                            "0.8100 | 4.00 |"));
  EXPECT_THAT(SummaryCsv(results), HasSubstr(",0.9,\"step(every=500, gamma=0.5)\",2,0,"));
  // Without a mean row nothing can be marked, and the table says so.
  results.erase(results.begin(), results.begin() + 6);
  const std::string without_mean = MarkdownTable(c, results);
  EXPECT_THAT(without_mean, HasSubstr("No `mean` row: whether an attack bites is not measured."));
  EXPECT_THAT(without_mean, Not(HasSubstr(" †")));
}

TEST(ExperimentReportTest, WorstCasePerRuleAndFNamesTheAttacks) {
  ExperimentConfig c;
  c.rules = {"mean", "caf"};
  c.attacks = {"none", "signflip", "ipm_opt", "alie_opt"};
  c.byzantine = {1, 2};
  // Per rule and f: none, signflip (never bites the mean), ipm_opt, alie_opt.
  const double acc[2][2][4] = {{{0.85, 0.84, 0.10, 0.10}, {0.85, 0.845, 0.10, 0.50}},
                               {{0.84, 0.80, 0.82, 0.83}, {0.83, 0.79, 0.81, 0.81}}};
  std::vector<CellResult> results;
  for (int r = 0; r < 2; ++r) {
    for (int f = 0; f < 2; ++f) {
      for (int a = 0; a < 4; ++a) {
        CellResult x;
        x.cell = {
            c.rules[r], c.attacks[a], static_cast<uint32_t>(f + 1), "iid", "fp32", 0.9, "constant",
            1};
        x.final_accuracy = acc[r][f][a];
        results.push_back(x);
      }
    }
  }
  const std::string md = MarkdownTable(c, results);
  EXPECT_THAT(md, HasSubstr("| rule | f | no attack | worst | drop | worst attack | worst that "
                            "bites | drop | attack |\n|---|---|---|---|---|---|---|---|---|\n"));
  // Ties share the place; sign flip is the worst for CAF but does not bite.
  EXPECT_THAT(md, HasSubstr("| `mean` | 1 | 0.8500 | 0.1000 | 75.00 | ipm_opt, alie_opt | 0.1000 | "
                            "75.00 | ipm_opt, alie_opt |\n"));
  EXPECT_THAT(md, HasSubstr("| `caf` | 1 | 0.8400 | 0.8000 | 4.00 | signflip | 0.8200 | 2.00 | "
                            "ipm_opt |\n"));
  EXPECT_THAT(md, HasSubstr("| `caf` | 2 | 0.8300 | 0.7900 | 4.00 | signflip | 0.8100 | 2.00 | "
                            "ipm_opt, alie_opt |\n"));
  // A setting that varies gets its column.
  results[0].cell.split = "dirichlet(alpha=1)";
  EXPECT_THAT(MarkdownTable(c, results), HasSubstr("| rule | split | f | no attack |"));
}

TEST(ExperimentReportTest, WorstCaseOverSeedsAlsoAveragesEachSeedsOwnWorst) {
  ExperimentConfig c;
  c.rules = {"caf"};
  c.attacks = {"none", "signflip", "ipm_opt"};
  c.byzantine = {1};
  c.seeds = {1, 2};
  // Seed 1's worst is sign flip (4 points), seed 2's IPM (6 points); over the seeds' means
  // IPM is the worst (0.85 - 0.81 = 4 points), the seeds' own worst cases average 5.
  const double acc[2][3] = {{0.84, 0.80, 0.82}, {0.86, 0.85, 0.80}};
  std::vector<CellResult> results;
  for (int seed = 0; seed < 2; ++seed) {
    for (int a = 0; a < 3; ++a) {
      CellResult x;
      x.cell = {"caf",  c.attacks[a], 1,          "iid",
                "fp32", 0.9,          "constant", static_cast<uint64_t>(seed + 1)};
      x.final_accuracy = acc[seed][a];
      results.push_back(x);
    }
  }
  const std::string md = MarkdownTable(c, results);
  EXPECT_THAT(md,
              HasSubstr("| rule | f | no attack | worst | drop | seeds' drop | lowest seed | "
                        "worst attack |"));
  // The lowest seed is seed 1's sign flip, 0.80 (seed 2's IPM ties it: the first seen).
  EXPECT_THAT(md, HasSubstr("| `caf` | 1 | 0.8500 ± 0.0141 | 0.8100 ± 0.0141 | 4.00 | 5.00 | "
                            "0.800 | ipm_opt |"));
  // A seed without its no-attack cell does not count for the seeds' drop, but its
  // attacked runs still count for the lowest seed.
  results.erase(results.begin() + 3);
  EXPECT_THAT(MarkdownTable(c, results), HasSubstr("| 4.00 | 0.800 | ipm_opt |"));
  // Seed 1's lowest is now its IPM run (0.82), seed 2's its IPM run (0.81): the lowest of
  // all is seed 2's.
  results[1].final_accuracy = 0.83;
  results[4].final_accuracy = 0.81;
  EXPECT_THAT(MarkdownTable(c, results), HasSubstr("| 0.810 | ipm_opt |"));
  // One seed: no such column.
  results.resize(3);
  EXPECT_THAT(MarkdownTable(c, results), Not(HasSubstr("seeds' drop")));
}

// A run's rows, as the runner would have them, for the read-back tests.
std::vector<CellResult> SomeRows() {
  std::vector<CellResult> rows(3);
  rows[0].cell = {"mean", "none", 1, "iid", "fp32", 0.9, "step(every=500, gamma=0.2)", 1};
  rows[0].evals = {{0, 0.1}, {100, 0.7512}, {200, 0.8126}};
  rows[0].final_accuracy = 0.8126;
  rows[0].wall_seconds = 31.4;
  rows[1].cell = {"caf", "alie_opt", 2, "dirichlet(alpha=0.1)", "fp32", 0.9, "constant", 3, 20};
  rows[1].evals = {{0, 0.1}, {100, 0.25}};
  rows[1].final_accuracy = 0.25;
  rows[1].diverged = true;
  rows[1].wall_seconds = 2;
  rows[1].refused_pushes = 3;
  rows[2].cell = {"krum", "mimic", 1, "iid", "fp32", 0, "constant", 2};
  rows[2].error = "worker 3: boom, \"quoted\"\nsecond line";
  return rows;
}

TEST(ExperimentRowsTest, ReadsBackWhatTheRunWrote) {
  const std::vector<CellResult> rows = SomeRows();
  absl::StatusOr<std::vector<CellResult>> back =
      ParseRunRows(SummaryCsv(rows), ResultsCsv(rows), "out/x");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ((*back)[i].cell.Label(), rows[i].cell.Label());
    EXPECT_EQ((*back)[i].cell.bandwidth_mbps, rows[i].cell.bandwidth_mbps);
    EXPECT_EQ((*back)[i].evals, rows[i].evals) << i;
    EXPECT_EQ((*back)[i].final_accuracy, rows[i].final_accuracy) << i;
    EXPECT_EQ((*back)[i].diverged, rows[i].diverged) << i;
    EXPECT_EQ((*back)[i].wall_seconds, rows[i].wall_seconds) << i;
    EXPECT_EQ((*back)[i].refused_pushes, rows[i].refused_pushes) << i;
    EXPECT_EQ((*back)[i].error, rows[i].error) << i;
  }
  // What it wrote, written again, is the same text.
  EXPECT_EQ(SummaryCsv(*back), SummaryCsv(rows));
  EXPECT_EQ(ResultsCsv(*back), ResultsCsv(rows));
  // A summary from before the refused_pushes column reads as refusals unknown.
  const std::string old =
      "rule,attack,byzantine,split,codec,worker_momentum,lr_schedule,seed,bandwidth_mbps,"
      "final_accuracy,diverged,wall_seconds,error\n"
      "mean,none,1,iid,fp32,0.9,constant,1,0,0.8716,false,30.8,\n";
  absl::StatusOr<std::vector<CellResult>> older = ParseRunRows(
      old,
      "rule,attack,byzantine,split,codec,worker_momentum,lr_schedule,seed,bandwidth_mbps,"
      "step,test_accuracy\n",
      "old");
  ASSERT_TRUE(older.ok()) << older.status();
  ASSERT_EQ(older->size(), 1u);
  EXPECT_EQ((*older)[0].final_accuracy, 0.8716);
  EXPECT_FALSE((*older)[0].refused_pushes.has_value());
  EXPECT_THAT(SummaryCsv(*older), HasSubstr(",0.8716,false,30.8,,\n"));
  EXPECT_TRUE((*older)[0].evals.empty());
}

TEST(ExperimentRowsTest, RefusesWhatItCannotRead) {
  const std::vector<CellResult> rows = SomeRows();
  const std::string summary = SummaryCsv(rows), results = ResultsCsv(rows);
  auto refused = [](std::string_view s, std::string_view r) {
    absl::StatusOr<std::vector<CellResult>> got = ParseRunRows(s, r, "run");
    return got.ok() ? std::string("accepted") : std::string(got.status().message());
  };
  EXPECT_THAT(refused("a,b\n1,2\n", results),
              HasSubstr("run/summary.csv: the header has no 'rule' column"));
  std::string bad = summary;
  bad.replace(bad.find("0.8126,false"), 6, "0.8x26");
  EXPECT_THAT(refused(bad, results),
              HasSubstr("run/summary.csv line 2: final_accuracy '0.8x26' is not a number"));
  EXPECT_THAT(refused(summary + "mean,none,1\n", results),
              HasSubstr("line 6: 3 fields, the header has 14"));  // the error spans two lines
  EXPECT_THAT(refused(summary + "\"open,quote\n", results),
              HasSubstr("line 6: a quoted field is not closed"));
  const std::string cut_off = results + "median,none,1,iid,fp32,0.9,constant,1,0,100,0.5\n";
  EXPECT_THAT(refused(summary, cut_off),
              HasSubstr("run/results.csv line 7: an evaluation of 'median | none | f=1"));
  // A run cut off between its two files (--resume) loses that cell's evaluations only.
  absl::StatusOr<std::vector<CellResult>> resumed =
      ParseRunRows(summary, cut_off, "run", /*interrupted=*/true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(ResultsCsv(*resumed), results);
  const std::string line = summary.substr(
      summary.find('\n') + 1, summary.find('\n', summary.find('\n') + 1) - summary.find('\n'));
  EXPECT_THAT(refused(summary + line, results), HasSubstr("appears twice"));
  EXPECT_THAT(refused("", results), HasSubstr("run/summary.csv is empty"));
}

TEST(ExperimentRowsTest, MergesSeedsRunApartIntoTheGridsOrder) {
  ExperimentConfig c;
  c.rules = {"mean", "caf"};
  c.attacks = {"none", "alie_opt"};
  c.byzantine = {2};
  c.seeds = {1, 2};
  auto run = [&](uint64_t seed) {
    std::vector<CellResult> rows;
    for (const Cell& cell : ExpandGrid(c)) {
      if (cell.seed != seed) continue;
      CellResult x;
      x.cell = cell;
      x.final_accuracy = cell.attack == "none" ? 0.85 : (cell.rule == "mean" ? 0.1 : 0.8);
      x.final_accuracy = *x.final_accuracy + 0.01 * static_cast<double>(seed);
      rows.insert(rows.begin(), x);  // backwards, to see the order restored
    }
    return rows;
  };
  absl::StatusOr<std::vector<CellResult>> merged =
      MergeRunRows(c, {{"seed2", run(2)}, {"seed1", run(1)}});
  ASSERT_TRUE(merged.ok()) << merged.status();
  std::vector<std::string> labels;
  for (const CellResult& r : *merged) labels.push_back(r.cell.Label());
  std::vector<std::string> grid;
  for (const Cell& cell : ExpandGrid(c)) grid.push_back(cell.Label());
  EXPECT_EQ(labels, grid);
  // The table has the seeds' spread: {0.86, 0.87} for the mean without attack.
  EXPECT_THAT(MarkdownTable(c, *merged), HasSubstr("| `mean` | 0 | constant | iid | fp32 | "
                                                   "0.8650 ± 0.0071 | 0.1150 ± 0.0071 |"));
  // Part of the grid is fine (the table shows what is there); rows of another grid or a
  // cell held twice are not.
  EXPECT_TRUE(MergeRunRows(c, {{"seed1", run(1)}}).ok());
  std::vector<CellResult> other = run(1);
  other[0].cell.split = "dirichlet(alpha=1)";
  absl::StatusOr<std::vector<CellResult>> wrong = MergeRunRows(c, {{"elsewhere", other}});
  EXPECT_THAT(wrong.status().message(), HasSubstr("elsewhere: cell 'caf | alie_opt | f=2 | "
                                                  "dirichlet(alpha=1)"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("is not in this config's grid"));
  absl::StatusOr<std::vector<CellResult>> twice =
      MergeRunRows(c, {{"a", run(1)}, {"b", run(2)}, {"c", run(1)}});
  EXPECT_THAT(twice.status().message(), HasSubstr("is in both a and c"));
  // --select: a grid of one rule takes that rule's rows out of the full run.
  std::vector<CellResult> both = run(1);
  ExperimentConfig caf_only = c;
  caf_only.rules = {"caf"};
  EXPECT_EQ(KeepGridRows(caf_only, both), 2u);
  ASSERT_EQ(both.size(), 2u);
  for (const CellResult& r : both) EXPECT_EQ(r.cell.rule, "caf");
  EXPECT_TRUE(MergeRunRows(caf_only, {{"seed1", both}}).ok());
  EXPECT_FALSE(MergeRunRows(caf_only, {{"seed1", run(1)}}).ok());
  // --resume's view: seed 1's rows at their grid positions, seed 2's positions empty.
  absl::StatusOr<std::vector<std::optional<CellResult>>> placed =
      PlaceRunRows(c, {{"seed1", run(1)}});
  ASSERT_TRUE(placed.ok()) << placed.status();
  const std::vector<Cell> cells = ExpandGrid(c);
  ASSERT_EQ(placed->size(), cells.size());
  for (size_t i = 0; i < cells.size(); ++i) {
    ASSERT_EQ((*placed)[i].has_value(), cells[i].seed == 1) << cells[i].Label();
    if ((*placed)[i]) {
      EXPECT_EQ((*placed)[i]->cell.Columns(), cells[i].Columns());
    }
  }
}

}  // namespace
}  // namespace ps::fashion_mnist

namespace ps::fashion_mnist {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ExperimentSuspicionTest, RanksTheLastFWorkersAgainstTheHonestOnes) {
  CellResult r;
  r.cell.rule = "caf";
  r.cell.attack = "signflip";
  r.cell.byzantine = 1;
  r.cell.split = "iid";
  r.cell.codec = "fp32";
  // Three workers, worker 2 Byzantine: ranked in the first window, tied in the second,
  // below an honest one in the third; the fourth lacks worker 1's score and does not count.
  r.suspicion = {{0, 0, {0.1, 0.0, 0.9}, {}, {}},
                 {0, 50, {0.0, 0.4, 0.4}, {}, {}},
                 {1, 0, {0.6, 0.0, 0.5}, {0.6, 0.0, 0.5}, {0.2, 0.3, -0.1}},
                 {1, 50, {0.0, NAN, 1.0}, {}, {}}};
  const SuspectRanking k = RankSuspects(r);
  EXPECT_EQ(k.windows, 3u);
  EXPECT_EQ(k.ranked, 1u);
  EXPECT_DOUBLE_EQ(k.honest_max, 0.6);
  EXPECT_DOUBLE_EQ(k.honest_mean, (0.1 + 0.0 + 0.0 + 0.4 + 0.6 + 0.0) / 6);
  EXPECT_DOUBLE_EQ(k.byzantine_mean, (0.9 + 0.4 + 0.5) / 3);
  const std::string table = SuspicionTable({r}, 0.5);
  EXPECT_THAT(table, HasSubstr("| caf | signflip | 1 | iid | 1 | 3 | 0.33 (1 of 3) | 0.600 (!) |"));
  const std::string csv = SuspicionCsv({r});
  EXPECT_THAT(csv, HasSubstr(",shard,first_round,worker,byzantine_worker,score,set_aside,"
                             "alignment\n"));
  EXPECT_THAT(csv, HasSubstr(",1,0,2,true,0.5000,0.5000,-0.1000\n"));
  EXPECT_THAT(csv, HasSubstr(",0,0,0,false,0.1000,nan,nan\n"));
  EXPECT_THAT(csv, Not(HasSubstr(",1,50,1,"))) << "no row for a worker without a score";
  EXPECT_EQ(SuspicionTable({CellResult{}}, 0.5), "") << "no windows, no table";
}

}  // namespace
}  // namespace ps::fashion_mnist
