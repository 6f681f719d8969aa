"""core.machine: what a figure records about the CPU it was measured on."""

from core.machine import cpu_facts, machine

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
cpu MHz\t\t: 2596.132
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni

processor\t: 1
model name\t: some other CPU
flags\t\t: fpu amx_tile
"""


def test_the_first_cpus_model_clock_and_widest_vector_extensions_are_read(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    facts = cpu_facts(path)
    assert facts == {"cpu": "AMD EPYC 9B14", "family_model": "25/17", "mhz": 2596,
                     "simd": ["avx512_vnni", "avx512f", "avx2", "avx"]}  # fmt: skip


def test_without_cpuinfo_the_platform_names_the_cpu(tmp_path):
    facts = cpu_facts(tmp_path / "missing")
    assert facts["cpu"] and facts["mhz"] is None and facts["simd"] == []
    assert machine()["cores"] >= 1
