# The machine a benchmark ran on, as one line for its output (sourced by
# the bench scripts): CPU model, family/model numbers, CPU count, the
# hypervisor (systemd-detect-virt --vm: kvm, qemu, none ...; "none" is
# bare metal), the kernel and the load average when asked. Figures from two
# machines are not one comparison: print this beside every ratio.
machine_line() {
    local model family number virt
    model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    family=$(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
    number=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
    virt=$(systemd-detect-virt --vm 2>/dev/null || true)
    if [ -z "$virt" ]; then
        virt=$(grep -qw hypervisor /proc/cpuinfo && echo "a hypervisor" || echo none)
    fi
    printf 'machine: %s (family %s model %s), %s CPUs, hypervisor %s, Linux %s, load %s\n' \
        "${model:-unknown CPU}" "${family:-?}" "${number:-?}" "$(nproc)" "${virt:-unknown}" \
        "$(uname -r)" "$(cut -d' ' -f1-3 /proc/loadavg)"
}
