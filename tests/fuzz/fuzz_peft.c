/*
 * fuzz_peft.c — libFuzzer target for PEFT's adapter_config.json reader
 * (peft_config_parse in kernels/peft.c): an adapter folder comes from
 * anyone's fine-tune. An accepted config is plain LoRA Strait can build:
 * a rank of 1 to LORA_RANK_MAX, a finite alpha above 0, targets among the
 * LORA_* bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    AdapterConfig a;
    char err[512];
    if (peft_config_parse((const char *)data, size, &a, err) != 0) return 0;
    if (a.rank < 1 || a.rank > LORA_RANK_MAX) abort();
    if (!(a.alpha > 0) || !isfinite(a.alpha)) abort();
    if (a.targets == 0 || (a.targets & ~(unsigned)LORA_ALL) != 0 || a.base != 0 ||
        a.base_seed != -1)
        abort();
    return 0;
}
