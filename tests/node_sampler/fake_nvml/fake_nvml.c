/* A fake libnvidia-ml.so.1: the NVML C entry points node_sampler reads, over state the tests set.
 *
 * Built by tests/node_sampler/conftest.py and loaded as pynvml.nvmlLib, so the real pynvml
 * ctypes wrappers (argument types, struct layouts, error mapping) run over it. The tests drive it
 * through the fake_* functions at the bottom. Every entry point takes one mutex; the event wait
 * gives it up while it blocks on a condition variable, so fake_push_xid from a test thread
 * wakes a watcher blocked in nvmlEventSetWait_v2.
 *
 *   gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_EVENT_TYPE_XID 0x8ULL
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

#define MAX_GPUS 16
#define MAX_PROCS 32
#define MAX_FAILS 64
#define MAX_COUNTS 256
#define MAX_SETS 8
#define MAX_EVENTS 64
#define MAX_LINKS 18
#define FI_DEV_MEMORY_TEMP 82
#define VALUE_TYPE_UNSIGNED_INT 1

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; int siVal; } value;
} nvmlFieldValue_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct { unsigned int pid; unsigned long long used; } fake_proc;

typedef struct fake_gpu {
    char uuid[96], name[96];
    unsigned int util, mem_util, temp, power_mw, power_limit_mw;
    unsigned long long used, total, ecc_unc, ecc_corr;
    int retired_pending, compute_mode, lost;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failed;
    unsigned long long reserved, reasons, ecc_unc_agg, ecc_corr_agg;
    unsigned int sm_clock, sm_clock_max, mem_clock, mem_clock_max;
    int mem_temp; /* < 0: the GPU has no memory sensor (the field answers NOT_SUPPORTED) */
    unsigned int thresholds[4]; /* shutdown, slowdown, memory max, GPU max */
    unsigned int pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replay;
    unsigned int nlinks, link_up[MAX_LINKS];
    unsigned long long link_errors[MAX_LINKS][4]; /* replay, recovery, CRC flit, CRC data */
    fake_proc procs[MAX_PROCS];
    unsigned int nprocs;
} *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct fake_set {
    int used;
    unsigned long long mask[MAX_GPUS];
    struct { int gpu; unsigned long long xid; } events[MAX_EVENTS];
    unsigned int head, count;
} *nvmlEventSet_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static struct fake_gpu gpus[MAX_GPUS];
static struct fake_set sets[MAX_SETS];
static unsigned int gpu_count;
static int init_count, init_error;
static struct { int gpu; char fn[64]; int code; } fails[MAX_FAILS];
static struct { int gpu; char fn[64]; unsigned int n; } counts[MAX_COUNTS];

__attribute__((constructor)) static void fake_load(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &attr);
}

static void count_call(int gpu, const char *fn) {
    for (int i = 0; i < MAX_COUNTS; i++) {
        if (counts[i].fn[0] && counts[i].gpu == gpu && !strcmp(counts[i].fn, fn)) { counts[i].n++; return; }
        if (!counts[i].fn[0]) {
            counts[i].gpu = gpu;
            snprintf(counts[i].fn, sizeof counts[i].fn, "%s", fn);
            counts[i].n = 1;
            return;
        }
    }
}

static int injected(int gpu, const char *fn) {
    for (int i = 0; i < MAX_FAILS; i++)
        if (fails[i].code && fails[i].gpu == gpu && !strcmp(fails[i].fn, fn)) return fails[i].code;
    return NVML_SUCCESS;
}

/* The common prologue of a call about no device: counted, then initialised?, then injected. */
static int enter(const char *fn) {
    count_call(-1, fn);
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    return injected(-1, fn);
}

/* ...and of a call about a device: valid handle?, lost?, then injected. Sets *gpu. */
static int enter_device(nvmlDevice_t dev, const char *fn, int *gpu) {
    if (dev < gpus || dev >= gpus + gpu_count) { count_call(-1, fn); return NVML_ERROR_INVALID_ARGUMENT; }
    *gpu = (int)(dev - gpus);
    count_call(*gpu, fn);
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (dev->lost) return NVML_ERROR_GPU_IS_LOST;
    return injected(*gpu, fn);
}

#define DEVICE_CALL(fn)                                       \
    int gpu, rc;                                              \
    pthread_mutex_lock(&mu);                                  \
    if ((rc = enter_device(dev, fn, &gpu)) != NVML_SUCCESS) { \
        pthread_mutex_unlock(&mu);                            \
        return rc;                                            \
    }                                                         \
    nvmlDevice_t g = &gpus[gpu];                              \
    (void)g;

#define DONE pthread_mutex_unlock(&mu); return NVML_SUCCESS

/* ---- library ------------------------------------------------------------------------------- */

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    count_call(-1, "nvmlInitWithFlags");
    int rc = init_error;
    if (!rc) init_count++;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    int rc = enter("nvmlShutdown");
    if (!rc) init_count--;
    pthread_mutex_unlock(&mu);
    return rc;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&mu);
    int rc = enter("nvmlDeviceGetCount_v2");
    if (!rc) *count = gpu_count;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    pthread_mutex_lock(&mu);
    int rc = index < gpu_count ? enter_device(&gpus[index], "nvmlDeviceGetHandleByIndex_v2", &(int){0})
                               : NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) *dev = &gpus[index];
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- device queries -------------------------------------------------------------------------- */

static int copy_text(char *out, unsigned int length, const char *text) {
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetUUID");
    rc = copy_text(uuid, length, g->uuid);
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetName");
    rc = copy_text(name, length, g->name);
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    DEVICE_CALL("nvmlDeviceGetIndex");
    *index = (unsigned int)gpu;
    DONE;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *util) {
    DEVICE_CALL("nvmlDeviceGetUtilizationRates");
    util->gpu = g->util;
    util->memory = g->mem_util;
    DONE;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    DEVICE_CALL("nvmlDeviceGetMemoryInfo");
    memory->total = g->total;
    memory->used = g->used;
    memory->free = g->total - g->used;
    DONE;
}

/* v2 says apart what the driver reserves; its used is what nvidia-smi shows as Used */
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    DEVICE_CALL("nvmlDeviceGetMemoryInfo_v2");
    if (memory->version != 0x02000028u) rc = 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    else {
        memory->total = g->total;
        memory->reserved = g->reserved;
        memory->used = g->used;
        memory->free = g->total - g->used - g->reserved;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* NVML's two-call protocol: too small an array (or none) gets INSUFFICIENT_SIZE and the count. */
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    DEVICE_CALL("nvmlDeviceGetComputeRunningProcesses_v3");
    if (*count < g->nprocs || (infos == NULL && g->nprocs)) {
        *count = g->nprocs;
        pthread_mutex_unlock(&mu);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < g->nprocs; i++) {
        infos[i].pid = g->procs[i].pid;
        infos[i].usedGpuMemory = g->procs[i].used;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = g->nprocs;
    DONE;
}

int nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    DEVICE_CALL("nvmlDeviceGetTemperature");
    if (sensor != 0) rc = NVML_ERROR_INVALID_ARGUMENT; /* only NVML_TEMPERATURE_GPU */
    else *temp = g->temp;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *milliwatts) {
    DEVICE_CALL("nvmlDeviceGetPowerUsage");
    *milliwatts = g->power_mw;
    DONE;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *milliwatts) {
    DEVICE_CALL("nvmlDeviceGetEnforcedPowerLimit");
    *milliwatts = g->power_limit_mw;
    DONE;
}

/* error type 0 corrected, 1 uncorrected; counter type 0 volatile, 1 aggregate */
int nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int error_type, int counter_type, unsigned long long *count) {
    DEVICE_CALL("nvmlDeviceGetTotalEccErrors");
    if ((counter_type != 0 && counter_type != 1) || (error_type != 0 && error_type != 1)) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (counter_type == 0) *count = error_type ? g->ecc_unc : g->ecc_corr;
    else *count = error_type ? g->ecc_unc_agg : g->ecc_corr_agg;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* clock type 0 graphics, 1 SM, 2 memory */
int nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    DEVICE_CALL("nvmlDeviceGetClockInfo");
    if (type == 0 || type == 1) *mhz = g->sm_clock;
    else if (type == 2) *mhz = g->mem_clock;
    else rc = NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    DEVICE_CALL("nvmlDeviceGetMaxClockInfo");
    if (type == 0 || type == 1) *mhz = g->sm_clock_max;
    else if (type == 2) *mhz = g->mem_clock_max;
    else rc = NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    DEVICE_CALL("nvmlDeviceGetCurrentClocksEventReasons");
    *reasons = g->reasons;
    DONE;
}

/* threshold 0 shutdown, 1 slowdown, 2 memory max, 3 GPU max; the acoustic ones are not supported */
int nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, int threshold, unsigned int *temp) {
    DEVICE_CALL("nvmlDeviceGetTemperatureThreshold");
    if (threshold < 0 || threshold > 7) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (threshold > 3 || !g->thresholds[threshold]) rc = NVML_ERROR_NOT_SUPPORTED;
    else *temp = g->thresholds[threshold];
    pthread_mutex_unlock(&mu);
    return rc;
}

/* each value answers on its own (nvmlReturn); only the memory temperature is known here */
int nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    DEVICE_CALL("nvmlDeviceGetFieldValues");
    for (int i = 0; i < count; i++) {
        values[i].timestamp = 0, values[i].latencyUsec = 0;
        if (values[i].fieldId == FI_DEV_MEMORY_TEMP && g->mem_temp >= 0) {
            values[i].valueType = VALUE_TYPE_UNSIGNED_INT;
            values[i].value.uiVal = (unsigned int)g->mem_temp;
            values[i].nvmlReturn = NVML_SUCCESS;
        } else {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    DONE;
}

int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen) {
    DEVICE_CALL("nvmlDeviceGetCurrPcieLinkGeneration");
    *gen = g->pcie_gen;
    DONE;
}

int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *gen) {
    DEVICE_CALL("nvmlDeviceGetMaxPcieLinkGeneration");
    *gen = g->pcie_gen_max;
    DONE;
}

int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *width) {
    DEVICE_CALL("nvmlDeviceGetCurrPcieLinkWidth");
    *width = g->pcie_width;
    DONE;
}

int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *width) {
    DEVICE_CALL("nvmlDeviceGetMaxPcieLinkWidth");
    *width = g->pcie_width_max;
    DONE;
}

int nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *count) {
    DEVICE_CALL("nvmlDeviceGetPcieReplayCounter");
    *count = g->pcie_replay;
    DONE;
}

/* an SXM board has no fan of its own, and Hopper retires no pages (it remaps rows) */
int nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int *speed) {
    DEVICE_CALL("nvmlDeviceGetFanSpeed");
    (void)speed;
    pthread_mutex_unlock(&mu);
    return NVML_ERROR_NOT_SUPPORTED;
}

int nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *count, unsigned long long *addresses) {
    DEVICE_CALL("nvmlDeviceGetRetiredPages");
    (void)cause, (void)count, (void)addresses;
    pthread_mutex_unlock(&mu);
    return NVML_ERROR_NOT_SUPPORTED;
}

int nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active) {
    DEVICE_CALL("nvmlDeviceGetNvLinkState");
    if (link >= MAX_LINKS) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (link >= g->nlinks) rc = NVML_ERROR_NOT_SUPPORTED;
    else *active = (int)g->link_up[link];
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, int counter, unsigned long long *value) {
    DEVICE_CALL("nvmlDeviceGetNvLinkErrorCounter");
    if (link >= MAX_LINKS || counter < 0 || counter > 4) rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (link >= g->nlinks || counter == 4) rc = NVML_ERROR_NOT_SUPPORTED;
    else *value = g->link_errors[link][counter];
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending) {
    DEVICE_CALL("nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = g->retired_pending;
    DONE;
}

int nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failure) {
    DEVICE_CALL("nvmlDeviceGetRemappedRows");
    *corr = g->remap_corr;
    *unc = g->remap_unc;
    *pending = g->remap_pending;
    *failure = g->remap_failed;
    DONE;
}

int nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *mode) {
    DEVICE_CALL("nvmlDeviceGetComputeMode");
    *mode = g->compute_mode;
    DONE;
}

/* ---- events ---------------------------------------------------------------------------------- */

static int valid_set(nvmlEventSet_t set) { return set >= sets && set < sets + MAX_SETS && set->used; }

int nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&mu);
    int rc = enter("nvmlEventSetCreate");
    if (!rc) {
        rc = 23; /* NVML_ERROR_INSUFFICIENT_RESOURCES */
        for (int i = 0; i < MAX_SETS; i++) {
            if (!sets[i].used) {
                memset(&sets[i], 0, sizeof sets[i]);
                sets[i].used = 1;
                *set = &sets[i];
                rc = NVML_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    DEVICE_CALL("nvmlDeviceRegisterEvents");
    if (!valid_set(set)) rc = NVML_ERROR_INVALID_ARGUMENT;
    else set->mask[gpu] |= types;
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    pthread_mutex_lock(&mu);
    int rc = enter("nvmlEventSetWait_v2");
    if (!rc && !valid_set(set)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc) {
        pthread_mutex_unlock(&mu);
        return rc;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    while (set->used && set->count == 0 && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &deadline);
    if (!set->used) rc = NVML_ERROR_INVALID_ARGUMENT; /* freed while waiting */
    else if (set->count == 0) rc = NVML_ERROR_TIMEOUT;
    else {
        int gpu = set->events[set->head].gpu;
        data->device = &gpus[gpu];
        data->eventType = NVML_EVENT_TYPE_XID;
        data->eventData = set->events[set->head].xid;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        set->head = (set->head + 1) % MAX_EVENTS;
        set->count--;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&mu);
    int rc = enter("nvmlEventSetFree");
    if (!rc && !valid_set(set)) rc = NVML_ERROR_INVALID_ARGUMENT;
    if (!rc) set->used = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- control, for the tests ------------------------------------------------------------------ */

void fake_reset(void) {
    pthread_mutex_lock(&mu);
    memset(gpus, 0, sizeof gpus);
    memset(sets, 0, sizeof sets);
    memset(fails, 0, sizeof fails);
    memset(counts, 0, sizeof counts);
    gpu_count = 0;
    init_count = init_error = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* n GPUs with ids "GPU-fake-<i>", idle, 80 GiB, 35 C, 70 W of 700 W, healthy; clocks, thresholds
 * and the PCIe link as an H200 answered them (docs/real-nvml.md), no NVLinks */
void fake_set_gpu_count(unsigned int n) {
    pthread_mutex_lock(&mu);
    gpu_count = n < MAX_GPUS ? n : MAX_GPUS;
    for (unsigned int i = 0; i < gpu_count; i++) {
        memset(&gpus[i], 0, sizeof gpus[i]);
        snprintf(gpus[i].uuid, sizeof gpus[i].uuid, "GPU-fake-%u", i);
        snprintf(gpus[i].name, sizeof gpus[i].name, "Fake H100 80GB HBM3");
        gpus[i].total = 80ULL << 30;
        gpus[i].temp = 35;
        gpus[i].power_mw = 70000;
        gpus[i].power_limit_mw = 700000;
        gpus[i].reserved = 616ULL << 20;
        gpus[i].reasons = 0x1; /* GPU idle */
        gpus[i].sm_clock = 345, gpus[i].sm_clock_max = 1980;
        gpus[i].mem_clock = gpus[i].mem_clock_max = 3201;
        gpus[i].mem_temp = 30;
        gpus[i].thresholds[0] = 95, gpus[i].thresholds[1] = 89, gpus[i].thresholds[2] = 95, gpus[i].thresholds[3] = 87;
        gpus[i].pcie_gen = gpus[i].pcie_gen_max = 5;
        gpus[i].pcie_width = gpus[i].pcie_width_max = 16;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_clocks(unsigned int i, unsigned int sm, unsigned int sm_max, unsigned int mem, unsigned int mem_max,
                     unsigned long long reasons) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        struct fake_gpu *g = &gpus[i];
        g->sm_clock = sm, g->sm_clock_max = sm_max, g->mem_clock = mem, g->mem_clock_max = mem_max, g->reasons = reasons;
    }
    pthread_mutex_unlock(&mu);
}

/* a threshold of 0 answers NOT_SUPPORTED, a memory temperature below 0 too */
void fake_set_thermal(unsigned int i, int mem_temp, unsigned int shutdown, unsigned int slowdown, unsigned int mem_max,
                      unsigned int gpu_max) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        struct fake_gpu *g = &gpus[i];
        g->mem_temp = mem_temp;
        g->thresholds[0] = shutdown, g->thresholds[1] = slowdown, g->thresholds[2] = mem_max, g->thresholds[3] = gpu_max;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_pcie(unsigned int i, unsigned int gen, unsigned int gen_max, unsigned int width, unsigned int width_max,
                   unsigned int replay) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        struct fake_gpu *g = &gpus[i];
        g->pcie_gen = gen, g->pcie_gen_max = gen_max, g->pcie_width = width, g->pcie_width_max = width_max;
        g->pcie_replay = replay;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_ecc_aggregate(unsigned int i, unsigned long long corrected, unsigned long long uncorrected) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) gpus[i].ecc_corr_agg = corrected, gpus[i].ecc_unc_agg = uncorrected;
    pthread_mutex_unlock(&mu);
}

/* link `link` of GPU i exists from now on (and every link below it) */
void fake_set_nvlink(unsigned int i, unsigned int link, int up, unsigned long long replay, unsigned long long recovery,
                     unsigned long long crc_flit, unsigned long long crc_data) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS && link < MAX_LINKS) {
        struct fake_gpu *g = &gpus[i];
        if (g->nlinks <= link) g->nlinks = link + 1;
        g->link_up[link] = up ? 1 : 0;
        g->link_errors[link][0] = replay, g->link_errors[link][1] = recovery;
        g->link_errors[link][2] = crc_flit, g->link_errors[link][3] = crc_data;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_gpu(unsigned int i, unsigned int util, unsigned int mem_util, unsigned long long used,
                  unsigned long long total, unsigned int temp, unsigned int power_mw, unsigned int power_limit_mw) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        struct fake_gpu *g = &gpus[i];
        g->util = util, g->mem_util = mem_util, g->used = used, g->total = total;
        g->temp = temp, g->power_mw = power_mw, g->power_limit_mw = power_limit_mw;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_health(unsigned int i, unsigned long long ecc_unc, unsigned long long ecc_corr, int retired_pending,
                     unsigned int remap_corr, unsigned int remap_unc, unsigned int remap_pending,
                     unsigned int remap_failed, int compute_mode) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        struct fake_gpu *g = &gpus[i];
        g->ecc_unc = ecc_unc, g->ecc_corr = ecc_corr, g->retired_pending = retired_pending;
        g->remap_corr = remap_corr, g->remap_unc = remap_unc;
        g->remap_pending = remap_pending, g->remap_failed = remap_failed, g->compute_mode = compute_mode;
    }
    pthread_mutex_unlock(&mu);
}

void fake_set_ids(unsigned int i, const char *uuid, const char *name) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) {
        snprintf(gpus[i].uuid, sizeof gpus[i].uuid, "%s", uuid);
        snprintf(gpus[i].name, sizeof gpus[i].name, "%s", name);
    }
    pthread_mutex_unlock(&mu);
}

/* used = NVML_VALUE_NOT_AVAILABLE reads as usedGpuMemory None in pynvml */
void fake_add_process(unsigned int i, unsigned int pid, unsigned long long used) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS && gpus[i].nprocs < MAX_PROCS) {
        gpus[i].procs[gpus[i].nprocs].pid = pid;
        gpus[i].procs[gpus[i].nprocs++].used = used;
    }
    pthread_mutex_unlock(&mu);
}

/* `fn` about GPU `gpu` (-1: a call about no device) returns `code` from now on; 0 heals it */
void fake_fail(int gpu, const char *fn, int code) {
    pthread_mutex_lock(&mu);
    int slot = -1;
    for (int i = 0; i < MAX_FAILS; i++) {
        if (fails[i].code && fails[i].gpu == gpu && !strcmp(fails[i].fn, fn)) { slot = i; break; }
        if (slot < 0 && !fails[i].code) slot = i;
    }
    if (slot >= 0) {
        fails[slot].gpu = gpu;
        snprintf(fails[slot].fn, sizeof fails[slot].fn, "%s", fn);
        fails[slot].code = code;
    }
    pthread_mutex_unlock(&mu);
}

void fake_lose_gpu(unsigned int i) {
    pthread_mutex_lock(&mu);
    if (i < MAX_GPUS) gpus[i].lost = 1;
    pthread_mutex_unlock(&mu);
}

void fake_set_init_error(int code) {
    pthread_mutex_lock(&mu);
    init_error = code;
    pthread_mutex_unlock(&mu);
}

/* Queues the XID on every event set that registered XID events for GPU i; 0 if none had. */
int fake_push_xid(unsigned int i, unsigned long long xid) {
    int delivered = 0;
    pthread_mutex_lock(&mu);
    for (int s = 0; i < MAX_GPUS && s < MAX_SETS; s++) {
        struct fake_set *set = &sets[s];
        if (set->used && (set->mask[i] & NVML_EVENT_TYPE_XID) && set->count < MAX_EVENTS) {
            set->events[(set->head + set->count) % MAX_EVENTS].gpu = (int)i;
            set->events[(set->head + set->count) % MAX_EVENTS].xid = xid;
            set->count++;
            delivered++;
        }
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return delivered;
}

/* Is some live event set listening for GPU i's XIDs? */
int fake_registered(unsigned int i) {
    int yes = 0;
    pthread_mutex_lock(&mu);
    for (int s = 0; i < MAX_GPUS && s < MAX_SETS; s++) yes |= sets[s].used && (sets[s].mask[i] & NVML_EVENT_TYPE_XID);
    pthread_mutex_unlock(&mu);
    return yes;
}

int fake_live_sets(void) {
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int s = 0; s < MAX_SETS; s++) n += sets[s].used;
    pthread_mutex_unlock(&mu);
    return n;
}

int fake_init_count(void) {
    pthread_mutex_lock(&mu);
    int n = init_count;
    pthread_mutex_unlock(&mu);
    return n;
}

/* Calls of `fn` about GPU `gpu` (-1: about no device); fn NULL: every call about that GPU. */
unsigned int fake_calls(int gpu, const char *fn) {
    unsigned int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_COUNTS && counts[i].fn[0]; i++)
        if (counts[i].gpu == gpu && (fn == NULL || !strcmp(counts[i].fn, fn))) n += counts[i].n;
    pthread_mutex_unlock(&mu);
    return n;
}
