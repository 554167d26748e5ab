"""DRA selectors: CEL over NVIDIA's devices as the driver publishes them, with Kubernetes' quantity and semver."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.drasel import CelDevice, SelectorError, check_syntax, device_value, matches
from tests.scheduler.remediation.dra_objects import GPUS, driver_slice

ENTRY = driver_slice("n1", "uid", GPUS)["spec"]["devices"][0]


def _device() -> CelDevice:
    return CelDevice(device_value("gpu.nvidia.com", ENTRY))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # The driver's own DeviceClass (deployments/helm/.../deviceclass-gpu.yaml).
        ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", True),
        ("device.attributes['gpu.nvidia.com'].type == 'mig'", False),
        ("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')", True),
        ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", True),
        ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('80Gi'))", False),
        ("device.capacity['gpu.nvidia.com'].memory == quantity('81559Mi')", True),
        ("quantity('1Gi') == quantity('1024Mi')", True),
        ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.0.0'))", True),
        ("device.attributes['gpu.nvidia.com'].driverVersion.major() == 580", True),
        ("device.attributes['gpu.nvidia.com'].driverVersion.isLessThan(semver('580.82.7-rc.1'))", False),
        ("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))", True),
        ("device.attributes['resource.kubernetes.io'].pciBusID == '0000:18:00.0'", True),
        ("'uuid' in device.attributes['gpu.nvidia.com']", True),
        ("isSemver('1.2') || isQuantity('ten')", False),
        # A domain the device has nothing of is an empty map, as in Kubernetes: has() and `in` work on it.
        ("has(device.attributes['example.com'].x)", False),
        ("!('x' in device.attributes[\"example.com\"]) && device.capacity['example.com'].size() == 0", True),
        # The strings extension Kubernetes' CEL carries.
        ("device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')", True),
        ("device.attributes['gpu.nvidia.com'].productName.split(' ')[1] == 'H100'", True),
        ("device.attributes['gpu.nvidia.com'].productName.split(' ', 2).size() == 2", True),
        ("device.attributes['gpu.nvidia.com'].productName.replace('NVIDIA ', '').trim().size() == 14", True),
        ("device.attributes['gpu.nvidia.com'].productName.indexOf('H100') == 7", True),
        # CEL's bindings extension: the value bound once, the name seen in the body alone.
        ("cel.bind(x, 2, x == 2)", True),
        (
            "cel.bind(a, device.attributes['gpu.nvidia.com'], a.type == 'gpu' && a.productName.startsWith('NVIDIA'))",
            True,
        ),
        ("cel.bind(x, 1, cel.bind(x, x + 1, x) == 2 && x == 1)", True),
        # The value is read only where the body reads the name, as in cel-go: no error on a device without it.
        (
            "cel.bind(p, device.attributes['gpu.nvidia.com'].profile, "
            "device.attributes['gpu.nvidia.com'].type == 'mig' && p == '1g.5gb')",
            False,
        ),
        ("cel.bind(x, device.attributes['gpu.nvidia.com'].nope, true)", True),
        ("cel.bind(x, 1, cel.bind(y, [x, 2], y.size()) == 2) && [3].map(x, x)[0] == 3", True),
        ("cel . bind ( m , {'k': [1, 2]} , m.k[1] ) == 2", True),
        # A call's text inside a string is no call.
        ("'cel.bind(x, 1, x)' == \"cel.bind(x, 1, x)\" && r'cel.bind(\\' != ''", True),
        ("cel.bind(s, 'a,b)\\'c', s.size()) == 6", True),
        # The sets extension, with CEL's equality (1 equals 1.0; true is no number).
        (
            "sets.contains(['NVIDIA H100 80GB HBM3', 'H200'], [device.attributes['gpu.nvidia.com'].productName])",
            True,
        ),
        ("sets.contains(['NVIDIA H200'], [device.attributes['gpu.nvidia.com'].productName])", False),
        ("sets.contains([1, 2, 3], [])", True),
        ("sets.contains([1, 2.0], [2, 1.0])", True),
        ("sets.contains([1], [true])", False),
        ("sets.equivalent([1, 2, 2], [2, 1])", True),
        ("sets.equivalent([1, 2], [1])", False),
        ("sets.intersects([device.attributes['gpu.nvidia.com'].driverVersion.major()], [570, 580])", True),
        ("sets.intersects([[1, 2]], [[1, 2.0]]) && !sets.intersects([], [1])", True),
    ],
)
def test_selectors_read_the_driver_s_attributes_and_capacity(expression: str, expected: bool) -> None:
    assert matches(expression, _device()) is expected


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("device.attributes['gpu.nvidia.com'].memorySize > 10", "no such key"),
        ("device.capacity['gpu.nvidia.com'].memory > quantity('1')", "failed"),
        ("device.attributes['gpu.nvidia.com'].productName.compareTo(semver('1.0.0')) == 0", "failed"),
        ("semver('1.0') == semver('1.0')", "not a semantic version"),
        ("device.driver", "not a bool"),
        ("device.driver ==", "does not compile"),
        ("sets.contains(device.driver, ['x'])", "not a list"),
        ("cel.bind(x.y, 2, true)", "simple identifiers"),
        ("cel.bind(x, 2)", "3 arguments"),
        ("cel.bind(x, 2, x == 2", "not closed"),
        ("cel.bind(x, device.attributes['gpu.nvidia.com'].nope, x == 1)", "no such key"),
        # Where the value's own names would be captured (a macro in the body binds ``device``) the bind is
        # eager: the value fails though the body's || would absorb the error in cel-go.
        ("cel.bind(x, device.attributes['gpu.nvidia.com'].nope, [1].map(device, x == 1 || true)[0])", "no such key"),
        ("cel.bind(x, 2, y == 2)", "failed"),
    ],
)
def test_an_expression_that_cannot_be_evaluated_is_an_error_never_a_no(expression: str, said: str) -> None:
    with pytest.raises(SelectorError, match=said):
        matches(expression, _device())
    if said == "does not compile":
        assert check_syntax(expression) is not None


def test_each_verdict_is_kept_on_the_device() -> None:
    device = _device()
    expression = "device.attributes['gpu.nvidia.com'].type == 'gpu'"
    assert matches(expression, device)
    device.verdicts[expression] = False  # what was kept is what is answered
    assert not matches(expression, device)


@given(a=st.integers(0, 10**6), b=st.integers(0, 10**6), unit=st.sampled_from(["", "Ki", "Mi", "Gi", "k", "M"]))
def test_quantity_order_is_the_order_of_the_amounts(a: int, b: int, unit: str) -> None:
    expression = f"quantity('{a}{unit}').compareTo(quantity('{b}{unit}'))"
    device = _device()
    sign = (a > b) - (a < b)
    assert matches(f"{expression} == {sign}", device)
