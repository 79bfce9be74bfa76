// `spanformer bench --mode generate` for the gpt family: greedy decoding's speed with the KV cache and
// recomputing the context, one token at a time after a prompt, to a full context.
#pragma once
#include "spanformer/config/gpt_config.h"
#include "spanformer/models/gpt.h"
#include "spanformer/train/family.h"

namespace spanformer::train {

// --tokens, --dtype and --recompute: refused outside generate mode, --tokens below 1 refused.
void check_decoding_settings(const BenchRequest& r);
// Times the model (built, on r.device, with its spans set) and reports as `family`'s bench.
void bench_decoding(models::GptModel& model, const GptModelConfig& c, const BenchRequest& r, const char* family);

}  // namespace spanformer::train
