/*
 * A stand-in for NVIDIA's libnvidia-ml.so, for testing Meridian's NVML probe on machines without a GPU.
 * It answers only the functions the probe calls, with devices described when it is compiled (a test builds
 * one library per case):
 *
 *   -DFAKE_DEVICES='"NAME|MEMORY_MIB|POWER_LIMIT_MW|UTILIZATION_PCT|POWER_MW;..."' (empty: no device)
 *   -DFAKE_FAIL='"init"' (or count, handle, name): that call fails (NVML_ERROR_DRIVER_NOT_LOADED for init,
 *                       NVML_ERROR_UNKNOWN otherwise)
 *
 * Every other NVML function is absent, as in a library older than the caller expects.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, INSUFFICIENT_SIZE = 7,
       DRIVER_NOT_LOADED = 9, UNKNOWN = 999 };

typedef struct {
    char name[96];
    unsigned long long memory_mib;
    unsigned int power_limit_mw;
    unsigned int utilization;
    unsigned int power_mw;
} device;

typedef device *nvmlDevice_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

static device devices[16];
static unsigned int count;
static int initialized;

#ifndef FAKE_DEVICES
#define FAKE_DEVICES ""
#endif
#ifndef FAKE_FAIL
#define FAKE_FAIL ""
#endif

static int failing(const char *what) { return strcmp(FAKE_FAIL, what) == 0; }

static void load(void) {
    const char *spec = FAKE_DEVICES;
    count = 0;
    char *copy = strdup(spec), *save = NULL;
    for (char *d = strtok_r(copy, ";", &save); d && count < 16; d = strtok_r(NULL, ";", &save)) {
        device *x = &devices[count];
        memset(x, 0, sizeof *x);
        if (sscanf(d, "%95[^|]|%llu|%u|%u|%u", x->name, &x->memory_mib, &x->power_limit_mw,
                   &x->utilization, &x->power_mw) >= 2)
            count++;
    }
    free(copy);
}

nvmlReturn_t nvmlInit_v2(void) {
    if (failing("init")) return DRIVER_NOT_LOADED;
    load();
    initialized = 1;
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) { initialized = 0; return OK; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return UNINITIALIZED;
    if (!n) return INVALID_ARGUMENT;
    if (failing("count")) return UNKNOWN;
    *n = count;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *d) {
    if (!initialized) return UNINITIALIZED;
    if (!d || index >= count) return INVALID_ARGUMENT;
    if (failing("handle")) return UNKNOWN;
    *d = &devices[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    if (!d || !name) return INVALID_ARGUMENT;
    if (failing("name")) return UNKNOWN;
    if (strlen(d->name) + 1 > length) return INSUFFICIENT_SIZE;
    strcpy(name, d->name);
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!d || !m) return INVALID_ARGUMENT;
    m->total = d->memory_mib * 1024ULL * 1024ULL;
    m->reserved = 0;
    m->used = 0;
    m->free = m->total;
    return OK;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    if (!d || !mw) return INVALID_ARGUMENT;
    if (!d->power_limit_mw) return NOT_SUPPORTED;
    *mw = d->power_limit_mw;
    return OK;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!d || !u) return INVALID_ARGUMENT;
    u->gpu = d->utilization;
    u->memory = 0;
    return OK;
}

/* -DOLD_LIBRARY leaves this one out, as a library older than the caller would. */
#ifndef OLD_LIBRARY
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!d || !mw) return INVALID_ARGUMENT;
    if (!d->power_mw) return NOT_SUPPORTED;
    *mw = d->power_mw;
    return OK;
}
#endif
