"""Every XID in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): what each means, and
the catalogue's resolution bucket (its immediate action), as gpumedic acts on it.

Reference data for the `xid` field of GpuXidReported: node-sampler takes the meaning from it,
the node-incident detector the bucket and severity. A code that is not here is unknown, never
dropped: the detector records it for a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

XidBucket = Literal["application", "noise", "ignore", "reset_gpu", "reboot", "person"]
"""application: the job's fault (restart the job), unless it repeats on one GPU across jobs;
noise: a consequence of another error (XID 45, and the details that follow an XID 48);
ignore: NVIDIA's catalogue says no action is needed; reset_gpu: reset the GPU once nothing holds
it; reboot: the node must restart (the GPU is off the bus); person: NVIDIA says contact support or
check the hardware, or names no action: a person decides."""


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    bucket: XidBucket
    severity: Literal["info", "warning", "critical"]
    mnemonic: str = ""
    nvidia_action: str = ""
    """The catalogue's immediate action as NVIDIA names it (RESTART_APP, RESET_GPU, WORKFLOW_XID_48 ...)."""


# NVIDIA's XID catalogue for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
# every code: code | mnemonic | what it means | the catalogue's immediate action. Codes the table marks
# "Unused" are kept, so a report of one is known for what it is. Codes 162-172 have no immediate
# action in the table; their bucket below is gpumedic's (OWN_BUCKETS).
_NVIDIA_CATALOGUE = """
1|ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD|Unused|CONTACT_SUPPORT
2|ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD|Unused|CONTACT_SUPPORT
3|ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD|Unused|CONTACT_SUPPORT
4|ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY|Unused|CONTACT_SUPPORT
5|ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW|Unused|CONTACT_SUPPORT
6|ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR|Unused|CONTACT_SUPPORT
7|ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR|Unused|CONTACT_SUPPORT
8|ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT|GPU stopped processing|RESTART_APP
9|ROBUST_CHANNEL_GR_ERROR_INSTANCE|Unused|CONTACT_SUPPORT
10|ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP|Unused|CONTACT_SUPPORT
11|ROBUST_CHANNEL_GR_ERROR_MISSING_HW|Invalid or corrupted push buffer stream|RESTART_APP
12|ROBUST_CHANNEL_GR_ERROR_SW_METHOD|Unused|CONTACT_SUPPORT
13|ROBUST_CHANNEL_GR_EXCEPTION|Graphics engine exception|RESTART_APP
14|ROBUST_CHANNEL_FAKE_ERROR|Fake or injected error from userspace|IGNORE
15|ROBUST_CHANNEL_SCANLINE_TIMEOUT|Unused|CONTACT_SUPPORT
16|ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT|Unused|CONTACT_SUPPORT
17|ROBUST_CHANNEL_PARAMETER_ERROR|Unused|CONTACT_SUPPORT
18|ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR|Unused|CONTACT_SUPPORT
19|ROBUST_CHANNEL_DISP_MISSED_NOTIFIER|Unused|CONTACT_SUPPORT
20|ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD|Unused|CONTACT_SUPPORT
21|ROBUST_CHANNEL_ME_ERROR_SW_METHOD|Unused|CONTACT_SUPPORT
22|ROBUST_CHANNEL_VP_ERROR_SW_METHOD|Unused|CONTACT_SUPPORT
23|ROBUST_CHANNEL_RC_LOGGING_ENABLED|Unused|CONTACT_SUPPORT
24|ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT|Unused|CONTACT_SUPPORT
25|ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY|Invalid or illegal push buffer stream|RESTART_APP
26|ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT|Unused|CONTACT_SUPPORT
27|ROBUST_CHANNEL_VP_ERROR|Unused|CONTACT_SUPPORT
28|ROBUST_CHANNEL_VP2_ERROR|Unused|CONTACT_SUPPORT
29|ROBUST_CHANNEL_BSP_ERROR|Unused|CONTACT_SUPPORT
30|ROBUST_CHANNEL_BAD_ADDR_ACCESS|Unused|CONTACT_SUPPORT
31|ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT|GPU memory page fault|RESTART_APP
32|ROBUST_CHANNEL_PBDMA_ERROR|Invalid or corrupted push buffer stream (PCIe quality)|RESTART_APP
33|ROBUST_CHANNEL_SEC_ERROR|Unused|CONTACT_SUPPORT
34|ROBUST_CHANNEL_MSVLD_ERROR|Unused|CONTACT_SUPPORT
35|ROBUST_CHANNEL_MSPDEC_ERROR|Unused|CONTACT_SUPPORT
36|ROBUST_CHANNEL_MSPPP_ERROR|Unused|CONTACT_SUPPORT
37|ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD|Driver firmware error|IGNORE
38|ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT|Driver firmware error|IGNORE
39|ROBUST_CHANNEL_CE0_ERROR|Copy engine exception|RESTART_APP
40|ROBUST_CHANNEL_CE1_ERROR|Copy engine exception|RESTART_APP
41|ROBUST_CHANNEL_CE2_ERROR|Copy engine exception|RESTART_APP
42|ROBUST_CHANNEL_VIC_ERROR|Unused|CONTACT_SUPPORT
43|ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR|GPU stopped processing (the application's own fault)|IGNORE
44|ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW|Graphics engine fault during context switch|IGNORE
45|ROBUST_CHANNEL_PREEMPTIVE_REMOVAL|Preemptive cleanup after previous errors|WORKFLOW_XID_45
46|ROBUST_CHANNEL_GPU_TIMEOUT_ERROR|GPU stopped processing|RESET_GPU
47|ROBUST_CHANNEL_NVENC0_ERROR|Unused|CONTACT_SUPPORT
48|ROBUST_CHANNEL_GPU_ECC_DBE|Double-bit ECC error|WORKFLOW_XID_48
49|SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY|Unused|CONTACT_SUPPORT
50|SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR|Unused|CONTACT_SUPPORT
51|SILENT_RUNNING_STRESS_TEST_FAILURE|Unused|CONTACT_SUPPORT
52|SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE|Unused|CONTACT_SUPPORT
53|SILENT_RUNNING_TEMP_REDUCED_CLOCKING|Unused|CONTACT_SUPPORT
54|SILENT_RUNNING_PWR_REDUCED_CLOCKING|Auxiliary power is not connected to the GPU board|CHECK_MECHANICALS
55|SILENT_RUNNING_TEMPERATURE_READ_ERROR|Unused|CONTACT_SUPPORT
56|DISPLAY_CHANNEL_EXCEPTION|Unused|CONTACT_SUPPORT
57|FB_LINK_TRAINING_FAILURE_ERROR|Unused|CONTACT_SUPPORT
58|FB_MEMORY_ERROR|Unused|CONTACT_SUPPORT
59|PMU_ERROR|Unused|CONTACT_SUPPORT
60|ROBUST_CHANNEL_SEC2_ERROR|Video processor exception|RESTART_APP
61|PMU_BREAKPOINT|Unused|CONTACT_SUPPORT
62|PMU_HALT_ERROR|Internal micro-controller halt|RESET_GPU
63|INFOROM_DRAM_RETIREMENT_EVENT|GPU memory remapping (or page retirement) event|IGNORE
64|INFOROM_DRAM_RETIREMENT_FAILURE|GPU memory remapping (or page retirement) failure|RESET_GPU
65|ROBUST_CHANNEL_NVENC1_ERROR|Unused|CONTACT_SUPPORT
66|ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION|Illegal access by driver|IGNORE
67|ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION|Illegal access by driver|IGNORE
68|ROBUST_CHANNEL_NVDEC0_ERROR|NVDEC0 exception|RESTART_APP
69|ROBUST_CHANNEL_GR_CLASS_ERROR|Graphics engine class error|RESTART_APP
70|ROBUST_CHANNEL_CE3_ERROR|Copy engine 3 error|RESTART_APP
71|ROBUST_CHANNEL_CE4_ERROR|Copy engine 4 error|RESTART_APP
72|ROBUST_CHANNEL_CE5_ERROR|Copy engine 5 error|RESTART_APP
73|ROBUST_CHANNEL_NVENC2_ERROR|Unused|CONTACT_SUPPORT
74|NVLINK_ERROR|NVLink error|WORKFLOW_NVLINK_ERR
75|ROBUST_CHANNEL_CE6_ERROR|Copy engine 6 error|RESTART_APP
76|ROBUST_CHANNEL_CE7_ERROR|Copy engine 7 error|RESTART_APP
77|ROBUST_CHANNEL_CE8_ERROR|Copy engine 8 error|RESTART_APP
78|VGPU_START_ERROR|vGPU start error|UPDATE_SWFW
79|ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS|GPU has fallen off the bus|RESTART_BM
80|PBDMA_PUSHBUFFER_CRC_MISMATCH|Corrupted data sent to GPU|RESTART_APP
81|ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR|Unused|CONTACT_SUPPORT
82|ROBUST_CHANNEL_NVJPG0_ERROR|NVJPG0 error|RESTART_APP
83|ROBUST_CHANNEL_NVDEC1_ERROR|NVDEC1 error|RESTART_APP
84|ROBUST_CHANNEL_NVDEC2_ERROR|NVDEC2 error|RESTART_APP
85|ROBUST_CHANNEL_CE9_ERROR|Copy engine 9 error|RESTART_APP
86|ROBUST_CHANNEL_OFA0_ERROR|OFA exception|RESTART_APP
87|NVTELEMETRY_DRIVER_REPORT|Unused|CONTACT_SUPPORT
88|ROBUST_CHANNEL_NVDEC3_ERROR|NVDEC3 error|RESTART_APP
89|ROBUST_CHANNEL_NVDEC4_ERROR|NVDEC4 error|RESTART_APP
90|LTC_ERROR|Unused|CONTACT_SUPPORT
91|RESERVED_XID|Unused|CONTACT_SUPPORT
92|EXCESSIVE_SBE_INTERRUPTS|High single-bit ECC error rate|IGNORE
93|INFOROM_ERASE_LIMIT_EXCEEDED|InfoROM wear limit reached (non-fatal)|IGNORE
94|ROBUST_CHANNEL_CONTAINED_ERROR|Contained memory error (one application)|RESTART_APP
95|ROBUST_CHANNEL_UNCONTAINED_ERROR|Uncontained memory error|RESET_GPU
96|ROBUST_CHANNEL_NVDEC5_ERROR|NVDEC5 error|RESTART_APP
97|ROBUST_CHANNEL_NVDEC6_ERROR|NVDEC6 error|RESTART_APP
98|ROBUST_CHANNEL_NVDEC7_ERROR|NVDEC7 error|RESTART_APP
99|ROBUST_CHANNEL_NVJPG1_ERROR|NVJPG1 error|RESTART_APP
100|ROBUST_CHANNEL_NVJPG2_ERROR|NVJPG2 error|RESTART_APP
101|ROBUST_CHANNEL_NVJPG3_ERROR|NVJPG3 error|RESTART_APP
102|ROBUST_CHANNEL_NVJPG4_ERROR|NVJPG4 error|RESTART_APP
103|ROBUST_CHANNEL_NVJPG5_ERROR|NVJPG5 error|RESTART_APP
104|ROBUST_CHANNEL_NVJPG6_ERROR|NVJPG6 error|RESTART_APP
105|ROBUST_CHANNEL_NVJPG7_ERROR|NVJPG7 error|RESTART_APP
106|SMBPBI_TEST_MESSAGE|SMBPBI test message|IGNORE
107|SMBPBI_TEST_MESSAGE_SILENT|SMBPBI test message (silent)|IGNORE
108|NVLINK_REMOTE_TRANSLATION_ERROR|Unused|IGNORE
109|ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR|Context switch timeout|RESET_GPU
110|SEC_FAULT_ERROR|Security fault|RESET_GPU
111|BUNDLE_ERROR_EVENT|Unused|CONTACT_SUPPORT
112|DISP_SUPERVISOR_ERROR|Unused|CONTACT_SUPPORT
113|DP_LT_FAILURE|Unused|CONTACT_SUPPORT
114|HEAD_RG_UNDERFLOW|Unused|CONTACT_SUPPORT
115|CORE_CHANNEL_REGS|Unused|CONTACT_SUPPORT
116|WINDOW_CHANNEL_REGS|Unused|CONTACT_SUPPORT
117|CURSOR_CHANNEL_REGS|Unused|CONTACT_SUPPORT
118|HEAD_REGS|Unused|CONTACT_SUPPORT
119|GSP_RPC_TIMEOUT|GSP RPC timeout|RESET_GPU
120|GSP_ERROR|GSP error|RESET_GPU
121|C2C_ERROR|Corrected errors on the C2C link to the Grace CPU|IGNORE
122|SPI_PMU_RPC_READ_FAIL|Unused|CONTACT_SUPPORT
123|SPI_PMU_RPC_WRITE_FAIL|Unused|CONTACT_SUPPORT
124|SPI_PMU_RPC_ERASE_FAIL|Unused|CONTACT_SUPPORT
125|INFOROM_FS_ERROR|Unused|CONTACT_SUPPORT
126|ROBUST_CHANNEL_CE10_ERROR|Copy engine 10 error|RESTART_APP
127|ROBUST_CHANNEL_CE11_ERROR|Copy engine 11 error|RESTART_APP
128|ROBUST_CHANNEL_CE12_ERROR|Copy engine 12 error|RESTART_APP
129|ROBUST_CHANNEL_CE13_ERROR|Copy engine 13 error|RESTART_APP
130|ROBUST_CHANNEL_CE14_ERROR|Copy engine 14 error|RESTART_APP
131|ROBUST_CHANNEL_CE15_ERROR|Copy engine 15 error|RESTART_APP
132|ROBUST_CHANNEL_CE16_ERROR|Copy engine 16 error|RESTART_APP
133|ROBUST_CHANNEL_CE17_ERROR|Copy engine 17 error|RESTART_APP
134|ROBUST_CHANNEL_CE18_ERROR|Copy engine 18 error|RESTART_APP
135|ROBUST_CHANNEL_CE19_ERROR|Copy engine 19 error|RESTART_APP
136|ALI_TRAINING_FAIL|NVLink training failed|RESET_GPU
137|NVLINK_PRIV_ERR|NVLink privilege error (often the application's)|IGNORE
138|ROBUST_CHANNEL_DLA_ERROR|Unused|CONTACT_SUPPORT
139|ROBUST_CHANNEL_OFA1_ERROR|OFA1 error|RESTART_APP
140|UNRECOVERABLE_ECC_ERROR_ESCAPE|Unrecovered ECC error|RESET_GPU
141|ROBUST_CHANNEL_FAST_PATH_ERROR|CUDA fast path error|IGNORE
142|ROBUST_CHANNEL_NVENC3_ERROR|NVENC3 error|CONTACT_SUPPORT
143|GPU_INIT_ERROR|GPU initialisation error|RESET_GPU
144|NVLINK_SAW_ERROR|NVLink SAW error|WORKFLOW_NVLINK5_ERR
145|NVLINK_RLW_ERROR|NVLink RLW error|WORKFLOW_NVLINK5_ERR
146|NVLINK_TLW_ERROR|NVLink TLW error|WORKFLOW_NVLINK5_ERR
147|NVLINK_TREX_ERROR|NVLink TREX error|WORKFLOW_NVLINK5_ERR
148|NVLINK_NVLPW_CTRL_ERROR|NVLink NVLPW_CTRL error|WORKFLOW_NVLINK5_ERR
149|NVLINK_NETIR_ERROR|NVLink NETIR error|WORKFLOW_NVLINK5_ERR
150|NVLINK_MSE_ERROR|NVLink MSE error|WORKFLOW_NVLINK5_ERR
151|ROBUST_CHANNEL_KEY_ROTATION_ERROR|Key rotation error|RESTART_VM
152|ROBUST_CHANNEL_DLA_SMMU_ERROR|DLA SMMU error|IGNORE
153|ROBUST_CHANNEL_DLA_TIMEOUT|DLA timeout|IGNORE
154|GPU_RECOVERY_ACTION_CHANGED|GPU recovery action changed (summarises the other XIDs' recovery)|XID_154
155|NVLINK_SW_DEFINED_ERROR|NVLink software-defined error (an intentional link down)|RESET_GPU
156|RESOURCE_RETIREMENT_EVENT|Resource retirement event|RESET_GPU
157|RESOURCE_RETIREMENT_FAILURE|Resource retirement failure (no repair resources left)|IGNORE
158|GPU_FATAL_TIMEOUT|GPU fatal timeout|RESET_GPU
159|ROBUST_CHANNEL_CHI_NON_DATA_ERROR|CHI non-data error (C2C link)|CHECK_UVM
160|CHANNEL_RETIREMENT_EVENT|Channel retirement event|IGNORE
161|CHANNEL_RETIREMENT_FAILURE|Channel retirement failure|IGNORE
162|PSHC_REENGAGED|Power smoothing circuitry re-engaged|
163|PSHC_DISENGAGED|Power smoothing circuitry disengaged|
164|PSHC_LOW_LIFETIME|Power smoothing circuitry near the end of its lifetime|
165|PSHC_ZERO_LIFETIME|Power smoothing circuitry lifetime exhausted|
166|NVLINK_SECURE_CRYPTO_ERR|Confidential-computing traffic before the link was set up for it|
167|PCIE_FATAL_TIMEOUT|PCIe fatal timeout|
168|REDUCED_GPU_MEMORY_CAPACITY|Errors in the write-protected region (ECC disabled)|
169|SEC2_HALT_ERROR|Internal micro-controller halt (SEC2)|
170|NVLINK_SECURE_OTHER|Interrupt seen in confidential-computing mode|
171|UNCORRECTABLE_DRAM_ERROR|Details of an XID 48 in DRAM|
172|UNCORRECTABLE_SRAM_ERROR|Details of an XID 48 in SRAM|
"""

ACTION_BUCKETS: Mapping[str, XidBucket] = MappingProxyType(
    {
        "RESTART_APP": "application",
        "IGNORE": "ignore",
        "WORKFLOW_XID_45": "noise",  # solo: the application's; after other XIDs: their consequence
        "RESET_GPU": "reset_gpu",
        "WORKFLOW_XID_48": "reset_gpu",  # a reset (or reboot) clears it; check the SRAM threshold
        "WORKFLOW_NVLINK_ERR": "reset_gpu",
        "WORKFLOW_NVLINK5_ERR": "reset_gpu",
        "RESTART_BM": "reboot",
        "RESTART_VM": "reboot",
        "XID_154": "reboot",  # the recovery action changed: its string names it; a person reads it
        "CONTACT_SUPPORT": "person",
        "CHECK_MECHANICALS": "person",
        "UPDATE_SWFW": "person",
        "CHECK_UVM": "person",
    }
)
"""NVIDIA's immediate actions, as gpumedic acts on them."""

OWN_BUCKETS: Mapping[int, XidBucket] = MappingProxyType(
    {
        162: "ignore", 163: "ignore", 166: "ignore", 170: "ignore",  # power smoothing state, confidential computing
        164: "person", 165: "person", 167: "person", 168: "person", 169: "person",
        171: "noise", 172: "noise",  # the details of an XID 48, which is the incident
    }
)
"""The codes whose row in NVIDIA's table names no immediate action."""

SEVERITY: Mapping[XidBucket, Literal["info", "warning", "critical"]] = MappingProxyType(
    {"application": "warning", "noise": "info", "ignore": "info", "reset_gpu": "critical", "reboot": "critical", "person": "warning"}
)


def _catalogue() -> Mapping[int, XidInfo]:
    table = {}
    for line in _NVIDIA_CATALOGUE.strip().splitlines():
        code, mnemonic, meaning, action = line.split("|")
        bucket = ACTION_BUCKETS[action] if action else OWN_BUCKETS[int(code)]
        table[int(code)] = XidInfo(int(code), meaning, bucket, SEVERITY[bucket], mnemonic, action)
    return MappingProxyType(table)


XID_CATALOGUE: Mapping[int, XidInfo] = _catalogue()

MEMORY_XIDS = frozenset({48, 63, 64, 92, 94, 95, 140, 171, 172})
"""The XIDs of GPU memory errors: what a GPU's ECC counts and row remapping also show."""

MAX_KNOWN_XID = 1000
"""Codes run to the low hundreds; one far above is a malformed report more likely than a new XID."""
