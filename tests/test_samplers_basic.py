import torch

from samplers import euler, shift_time, timesteps


def test_schedule_endpoints_and_shift():
    schedule = timesteps(10)
    assert schedule.shape == (11,) and schedule[0] == 1.0 and schedule[-1] == 0.0
    assert torch.all(schedule[1:] < schedule[:-1])
    shifted = timesteps(10, shift=3.0)
    t = torch.linspace(1, 0, 11)
    torch.testing.assert_close(shifted, 3 * t / (1 + 2 * t))
    assert torch.all(shifted >= schedule)
    truncated = timesteps(4, t_max=0.8, t_min=0.2)
    torch.testing.assert_close(truncated, torch.tensor([0.8, 0.65, 0.5, 0.35, 0.2]))
    torch.testing.assert_close(shift_time(torch.tensor([0.0, 1.0]), 5.0), torch.tensor([0.0, 1.0]))


def test_euler_is_exact_for_straight_flows():
    # v = eps - x0 is constant along x_t = (1 - t) x0 + t eps: Euler recovers x0 in any number of steps.
    x0, eps = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)

    def velocity(x, t, cond):
        return eps - x0

    for steps in (1, 3, 10):
        torch.testing.assert_close(euler(velocity, eps, timesteps(steps)).x0, x0, rtol=1e-5, atol=1e-5)
