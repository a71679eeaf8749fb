/*
 * fuzz_model_config.c — libFuzzer target for the model description reader
 * (model_config_parse in kernels/config.c): a site builds whatever a
 * coordinator's Hello describes, and a checkpoint's metadata carries the
 * same JSON. An accepted description must be one model_config_params can
 * size within the 4 billion parameters the check promises (the adapters'
 * values, frozen or not, counted), and survive being written and read
 * again unchanged (its adapters' rule and draw included).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ModelConfig c, again;
    char err[512];
    if (model_config_parse((const char *)data, size, &c, err) != 0) return 0;
    if (!(model_config_params(&c) + model_adapter_params(&c) <= 4e9)) abort();
    char *text = model_config_json(&c);
    if (model_config_parse(text, strlen(text), &again, err) != 0) abort();
    if (again.arch != c.arch || again.L != c.L || again.NKV != c.NKV || again.Vp != c.Vp) abort();
    if (again.lora.rank != c.lora.rank || again.lora.rule != c.lora.rule ||
        again.lora.a_seed != c.lora.a_seed || again.lora.targets != c.lora.targets ||
        again.lora.base_bf16 != c.lora.base_bf16 || again.lora.dropout != c.lora.dropout)
        abort();
    if (c.lora.rank > 0 && model_adapter_trained(&c) > model_adapter_params(&c)) abort();
    free(text);
    return 0;
}
